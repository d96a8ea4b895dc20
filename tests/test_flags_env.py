"""Configuration reaches a command only through the flag layer (dra_driver/commands/flags.py): each flag also
from `DRA_DRIVER_<FLAG>`, some from a variable another component sets (`fallback_env`), nothing from
`os.environ` elsewhere in dra_driver/commands/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dra_driver.commands import compute_domain_daemon
from dra_driver.commands.flags import Flag, FlagParser, add_flags, apply_env_defaults

COMMANDS = Path(__file__).resolve().parents[1] / "dra_driver" / "commands"


def _parser(environ: dict[str, str]) -> FlagParser:
    parser = FlagParser(prog="t")
    parser.add_argument("--lease-namespace", default="", fallback_env="POD_NAMESPACE", help="the namespace")
    parser.add_argument("--max-nodes", type=int, default=18, fallback_env="MAX_NODES")
    apply_env_defaults(parser, environ)
    return parser


@pytest.mark.parametrize(
    ("environ", "argv", "expected"),
    [
        ({}, [], ""),
        ({"POD_NAMESPACE": "ns-pod"}, [], "ns-pod"),
        ({"POD_NAMESPACE": "ns-pod", "DRA_DRIVER_LEASE_NAMESPACE": "ns-flag"}, [], "ns-flag"),
        ({"POD_NAMESPACE": "ns-pod", "DRA_DRIVER_LEASE_NAMESPACE": ""}, [], "ns-pod"),  # empty counts as unset
        ({"POD_NAMESPACE": "ns-pod", "DRA_DRIVER_LEASE_NAMESPACE": "ns-flag"}, ["--lease-namespace", "cli"], "cli"),
    ],
)
def test_precedence_command_line_then_flag_variable_then_fallback(
    environ: dict[str, str], argv: list[str], expected: str
) -> None:
    assert _parser(environ).parse_args(argv).lease_namespace == expected


def test_a_fallback_goes_through_the_type_and_a_bad_one_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _parser({"MAX_NODES": "4"}).parse_args([]).max_nodes == 4
    with pytest.raises(SystemExit) as exited:
        _parser({"MAX_NODES": "four"})
    assert exited.value.code == 2
    assert "MAX_NODES='four' is invalid for --max-nodes" in capsys.readouterr().err


def test_help_names_both_variables() -> None:
    help_text = " ".join(_parser({}).format_help().split())  # argparse wraps lines
    assert "the namespace [env DRA_DRIVER_LEASE_NAMESPACE, else POD_NAMESPACE]" in help_text


def test_a_flag_table_makes_positionals_switches_short_options_and_required_flags(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DRA_DRIVER_DRY_RUN", "yes")
    monkeypatch.setenv("DRA_DRIVER_COUNT", "7")
    parser = FlagParser(prog="t")
    add_flags(parser, (
        Flag("action", choices=("run", "check"), help="what to do"),
        Flag("--dry-run", switch=True, help="change nothing"),
        Flag("--count", type=int, default=3, short="-c", help="how many"),
        Flag("--name", required=True, help="whose"),
    ))
    args = parser.parse_args(["check", "--name", "a"])
    assert (args.action, args.dry_run, args.count, args.name) == ("check", True, 7, "a")  # the environment applied
    assert parser.parse_args(["run", "-c", "1", "--name", "b"]).count == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["run"])
    assert "the following arguments are required: --name" in capsys.readouterr().err


def test_a_flag_table_makes_repeatable_flags_and_negating_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    table = (
        Flag("--node", repeatable=True, help="only these nodes"),
        Flag("--watch-list", switch=True, help="watch"),
        Flag("--no-watch-list", negates="--watch-list", help="page"),
    )
    parser = FlagParser(prog="t")
    add_flags(parser, table)
    args = parser.parse_args([])
    assert (args.node, args.watch_list) == ([], False)
    args = parser.parse_args(["--node", "a", "--node", "b", "--watch-list"])
    assert (args.node, args.watch_list) == (["a", "b"], True)
    assert parser.parse_args(["--watch-list", "--no-watch-list"]).watch_list is False
    monkeypatch.setenv("DRA_DRIVER_NODE", "n1, n2")  # a repeatable flag's variable lists its values
    monkeypatch.setenv("DRA_DRIVER_WATCH_LIST", "true")
    parser = FlagParser(prog="t")
    add_flags(parser, table)
    args = parser.parse_args([])
    assert (args.node, args.watch_list) == (["n1", "n2"], True)
    assert parser.parse_args(["--node", "n3", "--node", "n4"]).node == ["n3", "n4"]  # the command line wins
    assert parser.parse_args(["--no-watch-list"]).watch_list is False


def test_the_imex_daemon_reads_its_downward_api_and_claim_variables_through_flags() -> None:
    parser = FlagParser(prog="d")
    compute_domain_daemon.add_arguments(parser)
    apply_env_defaults(parser, {"NODE_NAME": "n1", "POD_IP": "10.0.0.7", "CLIQUE_ID": "c.1",
                                "COMPUTE_DOMAIN_UUID": "u", "POD_NAMESPACE": "drv"})
    args = parser.parse_args(["run"])
    assert (args.node_name, args.pod_ip, args.clique_id, args.domain_uid, args.driver_namespace) == (
        "n1", "10.0.0.7", "c.1", "u", "drv")


def test_no_command_reads_the_environment_but_the_flag_layer() -> None:
    offenders = []
    for path in sorted(COMMANDS.glob("*.py")):
        if path.name == "flags.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"):
                offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"read configuration through the flag layer (fallback_env), not os.environ: {offenders}"
