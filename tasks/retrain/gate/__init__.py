"""The retrain gate, in one folder: the champion it tests against (champion.py), whether a
config can reach a decision at all (prompts.py: the one rule the commands check before they
start and the round again), its scorer (scorers.py), the challenger's alignment tax and its
veto (tax.py) and the stage itself (stage.py: the paired test of both policies' answers on
held-out prompts, its decision and side-by-side table). Its settings are ``retrain.gate``
(tasks/config/sections.py); the test's arithmetic is rlhf_core/eval/gate.py."""
