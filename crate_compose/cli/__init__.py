"""The ``crate-compose`` command: a thin layer over the Python API (:mod:`crate_compose`).

Exit status:

* 0 on success (and for a finished run resumed with its own steps: nothing to do);
* 2 for a bad spec, bad arguments, data, a checkpoint or a grid that cannot be used, or a resume that
  would change the run (every problem listed, each located);
* 1 when an output cannot be written (a full disk, a read-only folder, a FIFO or a device given as
  ``--out``, a file or someone else's files where an output folder goes): the path is named, and
  earlier outputs are left intact;
* 3 when another process is writing into the folder (its process id is named);
* 130 on Ctrl-C.

Under torchrun only rank 0 prints.

Only the standard library and torch-free modules load at start-up (``crate_compose`` itself loads
its names on first use): ``--help`` and argument errors answer before torch is imported, and
``validate`` reports a wrong path or a YAML syntax error before the primitives (and torch) load. An
``--out`` that cannot take the output, or a spec whose input does not fit the command, is refused
before torch loads too (:mod:`crate_compose.training.run_folder.preflight`).

Each command's arguments live beside its code, in a module of this package: :mod:`.spec` (build, render, validate,
inspect, derive, list, schema), :mod:`.train`, :mod:`.probe`, :mod:`.generate`, :mod:`.fill`, :mod:`.evaluate` (evaluate,
linear-probe), :mod:`.exchange` (import, export), :mod:`.fetch`, :mod:`.show`, :mod:`.segment` and :mod:`.study`, each with an
``add(command)`` that adds its subcommands and a ``run_<command>(args)`` for each; the argument types and the
groups of arguments several commands share are in :mod:`.arguments`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import crate_compose as cc

from ..errors import DiagramError, PluginError, SpecError, Stopped, WorkbenchError
from ..training import world
from . import ablate, evaluate, exchange, fetch, fill, generate, probe, segment, show, spec_commands, train
from .arguments import formulas_of, plugin_arguments, plugins_given, rank_zero

EPILOG = """examples:
  crate-compose build specs/mae.yaml --render          build CRATE-MAE-Base and draw it
  crate-compose build crate-base                       build a zoo preset into out/crate-base
  crate-compose render crate-large --expand --format png
  crate-compose build specs/crate.yaml --set sizes.depth=6 --set encoder.layer.sparsify.primitive=ista_soft
  crate-compose inspect zoo/crate-large.yaml --json
  crate-compose derive specs/crate.yaml --out crate-ae.yaml   the encoder with its inverse decoder
  crate-compose list primitives
  crate-compose inspect crate-tiny --set encoder.layer.compress.primitive=tssa    swap MSSA for TSSA
  crate-compose inspect my-net.yaml --plugin my_steps.py    primitives of your own (a module or a .py file)
  crate-compose train causal-crate-bytes --task lm --data text --steps 1500
  crate-compose generate causal-crate-bytes --weights runs/causal-crate-bytes/final --prompt "def "
  crate-compose train crate-bert-mini --task mlm --data wordpiece:text --steps 2000
  crate-compose fill runs/crate-bert-mini "import [MASK]"
"""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose error is the one line that says what is wrong and where the options are listed
    (not the whole usage first: train's is 36 lines)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists the options)\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog="crate-compose",
        description="Build white-box transformers from YAML specs of optimization steps.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"crate-compose {cc.__version__}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    plugin = plugin_arguments()

    def command(name: str, **kwargs) -> argparse.ArgumentParser:  # every command takes --plugin
        return commands.add_parser(name, parents=[plugin], **kwargs)

    for family in (
        spec_commands,
        train,
        probe,
        generate,
        fill,
        evaluate,
        exchange,
        fetch,
        show,
        segment,
        ablate,
    ):  # in the order of --help
        family.add(command)
    return top


COMMANDS = {
    "build": spec_commands.run_build,
    "validate": spec_commands.run_validate,
    "inspect": spec_commands.run_inspect,
    "derive": spec_commands.run_derive,
    "render": spec_commands.run_render,
    "list": spec_commands.run_list,
    "schema": spec_commands.run_schema,
    "train": train.run_train,
    "probe": probe.run_probe,
    "ablate": ablate.run_ablate,
    "generate": generate.run_generate,
    "fill": fill.run_fill,
    "evaluate": evaluate.run_evaluate,
    "linear-probe": evaluate.run_linear_probe,
    "show": show.run_show,
    "segment": segment.run_segment,
    "import": exchange.run_import,
    "export": exchange.run_export,
    "fetch": fetch.run_fetch,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cc.load_plugins(plugins_given(argv))  # first: a plug-in's tasks, their options and data sets are flags
    except PluginError as error:
        return _refuse(f"error: {error}", getattr(error, "exit_status", 2))
    args = parser().parse_args(argv)
    try:
        with formulas_of(args):
            return COMMANDS[args.command](args)
    except Stopped as error:  # SIGTERM during train: not an error of the input, one line saying where it stopped
        return _refuse(f"{error}", error.exit_status)
    except (SpecError, PluginError, WorkbenchError) as error:  # bad input, a refused run: located, one per line
        return _refuse(f"error: {error}", getattr(error, "exit_status", 2))
    except DiagramError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into a program that stopped reading (| head)
        sys.stdout = open(os.devnull, "w")
        return 0
    except OSError as error:
        return _refuse(f"error: cannot write output: {error}", 1, local=True)
    except KeyboardInterrupt:
        return 130


def _refuse(message: str, status: int, *, local: bool = False) -> int:
    """Print ``message`` and return ``status``. Under torchrun the other ranks reach the same refusal
    (every check is made alike, or shared by rank 0), so only rank 0 prints it; an error of one
    process alone (``local``) is printed by that process, with its rank."""
    if rank_zero():
        print(message, file=sys.stderr)
    elif local:
        print(f"rank {world.rank()}: {message}", file=sys.stderr)
    return status
