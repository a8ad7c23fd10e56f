"""The retrain gate, in one folder: the champion it tests against and why it may refuse to
run (champion.py), its scorer (scorers.py) and the stage itself (stage.py: the paired test of
both policies' answers on held-out prompts, its decision and side-by-side table). Its
settings are ``retrain.gate`` (tasks/config/sections.py); the test's arithmetic is
rlhf_core/eval/gate.py."""
