"""model.parallel: ddp by default, fsdp accepted, anything else refused naming the field."""

from cli.main import build_parser, main
from cli.runs import config_for


def test_parallel_defaults_to_ddp_and_a_bad_value_exits_2_naming_the_field(capsys):
    assert config_for(build_parser().parse_args(["run", "--nproc", "2"])).model.parallel \
        == "ddp"
    args = build_parser().parse_args(["run", "--set", "model.parallel=fsdp"])
    assert config_for(args).model.parallel == "fsdp"
    assert main(["run", "--set", "model.parallel=zero3"]) == 2
    assert "model.parallel" in capsys.readouterr().err
