"""Tests of hvdkeras.cli. `parse` and `config` make a checked `hvdkeras run` command line for them."""

from hvdkeras.cli import parse as cli


def parse(*argv):
    """`hvdkeras run ARGV`, parsed."""
    return cli.build_parser().parse_args(["run", *argv])


def config(*argv, **kwargs):
    """`hvdkeras run ARGV`, validated into a RunConfig on a machine where every file exists and every program
    is in /usr/bin."""
    kwargs.setdefault("isfile", lambda p: True)
    kwargs.setdefault("which", lambda name: f"/usr/bin/{name}")
    kwargs.setdefault("python", "/venv/bin/python")
    return cli.validate(parse(*argv), **kwargs)
