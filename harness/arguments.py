"""What the command lines refuse, and how they say it: one ``error:`` line naming the key (and the
nearest valid one), then one hint line, instead of a usage block and jsonargparse's Union report.

Also where the shipped configs live: ``configs/`` in a clone, the ``sentemb_configs`` package in an
installed wheel. ``--config configs/X.yaml`` finds the shipped file from any directory.
"""
from __future__ import annotations

import difflib
import os
import re
from argparse import ArgumentError, RawDescriptionHelpFormatter
from typing import Callable, Sequence

from encoders.paths import shipped_config_dir  # noqa: F401  (the folder also holds the quickstart rows)

HELP_HINT = "(run with --help for every option)"


def help_formatter():
    """jsonargparse's help, with the description (the project's examples) printed as written."""
    from jsonargparse import DefaultHelpFormatter

    class HelpFormatter(RawDescriptionHelpFormatter, DefaultHelpFormatter):
        pass

    return HelpFormatter


class CommandLineError(ValueError):
    """An argument the command line does not accept, explained in one line."""


def shipped_configs() -> list[str]:
    """Every shipped config, relative to the config folder (``dclr/official.yaml``, ...)."""
    root = shipped_config_dir()
    if root is None:
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.yaml"))


def resolve_config_args(args: Sequence[str]) -> list[str]:
    """``--config configs/X.yaml`` (or ``--config X.yaml``) that does not exist where the command runs
    becomes the shipped file, so an installed package runs its configs from any directory. Paths
    that exist are left alone; a name that matches no file stays as given (its error lists them)."""
    out = list(args)
    root = shipped_config_dir()
    for i, arg in enumerate(out):
        value, prefix = None, ""
        if arg == "--config" and i + 1 < len(out):
            continue  # the value is handled as its own item below
        if i > 0 and out[i - 1] == "--config":
            value = arg
        elif arg.startswith("--config="):
            value, prefix = arg[len("--config="):], "--config="
        if value is None or os.path.exists(value) or root is None:
            continue
        relative = value[len("configs/"):] if value.startswith("configs/") else value
        if (root / relative).is_file():
            out[i] = prefix + str(root / relative)
    return out


# A key named without a stage is the training one: `batch_size` means per_device_batch_size, not eval_batch_size.
STAGE_WORDS = {"eval", "val", "test", "dev"}


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def _word_score(word: str, candidate: str) -> float:
    """How near a key's last part is to a candidate's, read word by word (``_``-separated): each word of the typo
    matched to its nearest word of the candidate, averaged with the letters' similarity of the whole; a candidate
    with a stage word (eval, val, ...) that the typo does not have scores low."""
    words, theirs = word.lower().split("_"), candidate.lower().split("_")
    coverage = sum(max(_similarity(w, t) for t in theirs) for w in words) / len(words)
    score = (coverage + _similarity(word.lower(), candidate.lower())) / 2
    return score - 0.5 if (set(theirs) & STAGE_WORDS) - set(words) else score


def nearest(word: str, choices: Sequence[str], cutoff: float = 0.6) -> str | None:
    """The valid key nearest to ``word``: among the keys beside it (the same dotted parent), by
    :func:`_word_score` on the last part; otherwise the letters of the full key (``difflib``)."""
    parent, _, last = word.rpartition(".")
    siblings = [c for c in choices if c.rpartition(".")[0] == parent and c != word]
    if siblings:
        best = max(siblings, key=lambda c: _word_score(last, c.rpartition(".")[2]))
        if _word_score(last, best.rpartition(".")[2]) >= cutoff:
            return best
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return found[0] if found else None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def join_negative_values(args: Sequence[str]) -> list[str]:
    """``--key -1e-5`` as ``--key=-1e-5``: argparse takes a value that starts with ``-`` and is not a plain
    ``-1`` or ``-0.5`` (an exponent) for an option, and answers "expected one argument"."""
    out = list(args)
    for i in range(len(out) - 1, 0, -1):
        before, value = out[i - 1], out[i]
        if before.startswith("--") and "=" not in before and value.startswith("-") and _is_number(value):
            out[i - 1:i + 1] = [f"{before}={value}"]
    return out


CLONE_COMMANDS = {"python train.py": "sentemb-train", "python evaluate.py": "sentemb-evaluate",
                  "python stage.py": "sentemb-stage"}


def for_installed(text: str, prog: str) -> str:
    """A help text as the command that prints it is run: from a clone (``train.py``) as written; installed
    (``sentemb-train``), with the installed commands in place of a clone's scripts, and the docs named as the
    repository's files, which a wheel does not hold."""
    if prog.endswith(".py"):
        return text
    for script, command in CLONE_COMMANDS.items():
        text = text.replace(script, command)
    return re.sub(r"(?<!repository's )(?<![\w/])docs/(\w+\.md)", r"the repository's docs/\1", text)


def _flat_keys(config) -> list[str]:
    """Every dotted key of a parsed config (a jsonargparse Namespace: its keys are already dotted)."""
    return [str(k) for k in config.keys()] if hasattr(config, "keys") else []


def _drop_options(args: Sequence[str], keys: Sequence[str]) -> list[str]:
    """``args`` without the options whose key ends with one of ``keys`` (and their values)."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        key = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if key and any(key == k or key.endswith("." + k) for k in keys):
            i += 1 if "=" in arg else 2
            continue
        out.append(arg)
        i += 1
    return out


WRAPPERS = ("Parser key", "Problem with given class_path", "Does not validate", "Subtypes:", "Errors:")


def explain(err: ArgumentError | Exception, args: Sequence[str], reparse: Callable[[list[str]], object]) -> str:
    """One line for a parser error: the full dotted key and what is wrong with it.

    jsonargparse reports a bad key under a class (``model.init_args.encoder.init_args.X``) as a
    Union report of ten lines; the key is in its ``NestedArg``, the reason in its innermost line.
    For an unknown key, ``reparse`` parses the arguments without it, and the nearest of the keys
    that parse gives is suggested.
    """
    message = str(err).strip()
    lines = [line.strip().lstrip("- ").strip() for line in message.splitlines() if line.strip()]
    head = re.match(r'Parser key "([^"]+)":\s*(.*)', lines[0]) if lines else None
    parser_key = head.group(1) if head else None
    if parser_key == "config":
        path = re.search(r"File does not exist: '([^']+)'", message)
        shipped = ", ".join(shipped_configs()) or "none found"
        return (f"--config {path.group(1) if path else ''}: no such file; the shipped configs are: {shipped} "
                "(give one as configs/NAME.yaml)")
    nested = re.search(r"NestedArg\(key='([^']+)'", message)
    key = parser_key or ""
    if nested:
        key = f"{parser_key}.init_args.{nested.group(1)}"
        problem = next((i for i, line in enumerate(lines) if line.startswith("Problem with given class_path")), 0)
        leaf = next((line for line in lines[problem:] if not line.startswith(WRAPPERS)), lines[-1])
    else:
        leaf = (head.group(2) if head and head.group(2) else lines[1] if head and len(lines) > 1 else lines[0]) \
            if lines else message
    unrecognized = re.search(r"unrecognized arguments: --(\S+)", leaf, flags=re.IGNORECASE)
    if unrecognized and not nested:
        key = unrecognized.group(1).split("=", 1)[0]
    if unrecognized or re.search(r"Option '[^']+' is not accepted", leaf):
        relative = key.split(".init_args.", 1)[1] if nested else key
        try:
            valid = _flat_keys(reparse(_drop_options(args, [relative])))
        except Exception:  # another error in the rest: no suggestion, this error still stands
            valid = []
        near = nearest(key, valid)
        return f"unknown option --{key}" + (f"; did you mean --{near}?" if near else "")
    return f"--{key}: {leaf}" if key else leaf


def print_shipped_configs(argv: Sequence[str] | None = None) -> None:
    """``sentemb-configs``: the folder of the shipped configs, then each config's path."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog=os.path.basename(sys.argv[0]) or "sentemb-configs", allow_abbrev=False,
        description="Print the folder of the shipped configs, then the path of each config (paper settings, "
                    "their backbone overlays, configs/overlays/). Any of them runs from any folder as "
                    "`sentemb-train --config configs/NAME.yaml`; copy one to change it.")
    parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    root = shipped_config_dir()
    if root is None:
        raise SystemExit("error: no shipped configs found (neither a clone's configs/ nor the sentemb_configs package)")
    print(root)
    for name in shipped_configs():
        print(root / name)
