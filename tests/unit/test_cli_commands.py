"""The command table lists each command as its module adds it, so ``--help`` can list them all
without importing any."""

from __future__ import annotations

import argparse

import pytest

from tfrecordd.cli import COMMANDS, parser


def _subcommands(p: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return action


def test_every_module_adds_exactly_the_commands_the_table_names() -> None:
    sub = _subcommands(parser("*"))
    assert list(sub.choices) == list(COMMANDS)
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert helps == {name: help for name, (_, help) in COMMANDS.items()}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_alone_loads_its_own_module_and_lists_the_rest(command: str) -> None:
    sub = _subcommands(parser(command))
    assert list(sub.choices) == list(COMMANDS)
    real = sub.choices[command]
    assert real.get_default("func") is not None or command == "state"
