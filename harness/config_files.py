"""Config files checked as the command line is: a key that does not exist, at any depth, or a class path that
names no class, is one ``error:`` line naming the file, its line, the full key and the nearest valid key or class.

jsonargparse checks a YAML file only as a whole value of its group, so a typo in an overlay
(``model: {init_args: {lrr: 1e-5}}``) comes out as "--model: Does not validate against any of the Union subtypes",
naming neither the file nor the key, and ``--print_config`` prints such a file without checking it. This walks
every ``--config`` file in order, merging them as jsonargparse does, and checks each key against the parser's own
keys and, under ``model`` and ``data`` (and a nested class such as the encoder), against the ``__init__``
arguments of the class the merged configs name so far (following ``**kwargs`` to the base classes, as
jsonargparse does). Of the values, only a choice (``Literal``) is checked here, against its nearest valid one; a
file that is not YAML, or not a config (a table of data), is named with its line.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import typing
from typing import Any, Sequence

import yaml

from .arguments import CommandLineError, nearest

# Parser keys whose values are class specifications or lists of them that Lightning itself resolves
# (callbacks, loggers, plugins...): their inside is not checked here.
OPAQUE = ("trainer.callbacks", "trainer.logger", "trainer.plugins", "trainer.strategy", "trainer.profiler",
          "optimizer", "lr_scheduler")
SPEC_KEYS = ("class_path", "init_args", "dict_kwargs")


def _line_of(path: str, keys: Sequence[str]) -> int | None:
    """The 1-based line of a dotted key in a YAML file (None when it cannot be found)."""
    try:
        with open(path) as f:
            node = yaml.compose(f)
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return line
        for k, v in node.value:
            if getattr(k, "value", None) == key:
                line, node = k.start_mark.line + 1, v
                break
        else:
            return line
    return line


def _near(word: str, choices: Sequence[str]) -> str | None:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def literal_choices(annotation: Any) -> tuple[str, ...] | None:
    """The string values a ``Literal[...]`` argument takes (also inside ``Optional``), or None."""
    if typing.get_origin(annotation) is typing.Literal:
        values = typing.get_args(annotation)
        return values if all(isinstance(v, str) for v in values) else None
    for arg in typing.get_args(annotation):
        if (found := literal_choices(arg)) is not None:
            return found
    return None


TABLE_SUFFIXES = (".tsv", ".csv", ".txt", ".jsonl")


def read_config_file(path: str) -> Any:
    """A ``--config`` file's YAML, or a CommandLineError naming the file (and line) when it is not a config:
    text that is not YAML, a table of data, or YAML that holds no mapping of keys. None: the file cannot be
    opened (jsonargparse names a missing file with the shipped configs)."""
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    first = next((line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")), "")
    if path.lower().endswith(TABLE_SUFFIXES) or ("\t" in first and ":" not in first.split("\t")[0]):
        columns = "tab-separated" if "\t" in first else "comma-separated" if "," in first else "one per line"
        raise CommandLineError(f"{path}: not a config: it reads as a table of data ({columns} columns: "
                               f"{first[:60]!r}); a config is a YAML file of keys (model:, data:, trainer: ...), "
                               "such as configs/quickstart.yaml")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = " ".join(str(x) for x in (getattr(err, "problem", None), getattr(err, "context", None)) if x)
        raise CommandLineError(f"{path}{f':{mark.line + 1}' if mark else ''}: not valid YAML: "
                               f"{problem or str(err).splitlines()[0]}") from None
    if data is not None and not isinstance(data, dict):
        kind = {list: "a list", str: "a single string"}.get(type(data), f"a {type(data).__name__}")
        raise CommandLineError(f"{path}: not a config: a config is a YAML mapping of keys (model:, data:, "
                               f"trainer: ...), this file holds {kind}")
    return data


def init_arguments(cls: type) -> dict[str, Any]:
    """Argument name -> annotation of ``cls.__init__``, with those of its bases while ``**kwargs`` passes on."""
    out: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            hints = typing.get_type_hints(init)
        except Exception:  # an annotation that does not resolve: the names are still right
            hints = {}
        params = inspect.signature(init).parameters
        for name, p in params.items():
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                out.setdefault(name, hints.get(name, p.annotation))
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            break
    return out


def _class_of(annotation: Any) -> type | None:
    """The class an argument takes as a ``class_path`` spec (``SentenceEncoder``, ``Optional[X]``...)."""
    if inspect.isclass(annotation):
        return annotation
    for arg in typing.get_args(annotation):
        if inspect.isclass(arg) and arg is not type(None):
            return arg
    return None


def _known_classes(base: type) -> list[str]:
    """``module.Name`` of every class of the project's packages that is ``base`` or a subclass of it."""
    names = []
    for package in ("lightning_modules", "datamodules", "encoders"):
        module = importlib.import_module(package)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if inspect.isclass(obj) and issubclass(obj, base):
                names.append(f"{package}.{name}")
    return names


def resolve_class(class_path: str, base: type) -> type | None:
    """The class of a ``class_path`` (full ``module.Name``, or a bare name of the project's classes)."""
    if "." in class_path:
        module, _, name = class_path.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), name, None)
        except ImportError:
            return None
        return obj if inspect.isclass(obj) else None
    for known in _known_classes(base):
        if known.rsplit(".", 1)[1] == class_path:
            return resolve_class(known, base)
    return None


class _Checker:
    def __init__(self, keys: set[str], subclasses: dict[str, type]) -> None:
        self.keys = keys  # the parser's dotted keys
        self.subclasses = subclasses  # group -> base class (model, data)
        self.classes: dict[str, str] = {}  # dotted path of a class spec -> its class_path, merged so far

    def fail(self, where: str, path: list[str], message: str) -> None:
        line = _line_of(where, path)
        raise CommandLineError(f"{where}{f':{line}' if line else ''}: {message}")

    def walk(self, value: Any, path: list[str], where: str) -> None:
        dotted = ".".join(path)
        if path and path[0] in self.subclasses and len(path) == 1:
            return self.spec(value, path, self.subclasses[path[0]], where)
        if dotted in self.keys or dotted in OPAQUE:
            return
        if path and not any(k.startswith(dotted + ".") for k in self.keys):
            level = [k for k in self.keys if k.count(".") == dotted.count(".")
                     and k.rsplit(".", 1)[0] == dotted.rpartition(".")[0]] if "." in dotted else \
                [k.split(".")[0] for k in self.keys]
            near = nearest(dotted, level) or nearest(dotted, sorted(self.keys))
            self.fail(where, path, f"unknown key {dotted}" + (f"; did you mean {near}?" if near else ""))
        if isinstance(value, dict):
            for key, inner in value.items():
                self.walk(inner, [*path, str(key)], where)

    def spec(self, value: Any, path: list[str], base: type, where: str) -> None:
        """A class specification: ``class_path`` (checked), ``init_args`` (each checked against the class)."""
        dotted = ".".join(path)
        if isinstance(value, str):  # `model: lightning_modules.MNR`
            value = {"class_path": value}
        if not isinstance(value, dict):
            return
        if "class_path" in value:
            class_path = str(value["class_path"])
            if resolve_class(class_path, base) is None:
                known = _known_classes(base)
                near = _near(class_path, known) or _near(class_path, [k.rsplit(".", 1)[1] for k in known])
                self.fail(where, [*path, "class_path"], f"{dotted}.class_path: no class {class_path}"
                          + (f"; did you mean {near}?" if near else f"; known: {', '.join(known)}"))
            self.classes[dotted] = class_path
        cls = resolve_class(self.classes[dotted], base) if dotted in self.classes else None
        if cls is None:
            return  # no class named yet: the init args are checked once one is (jsonargparse's own error)
        arguments = init_arguments(cls)
        init = value.get("init_args") if isinstance(value.get("init_args"), dict) else {}
        loose = {k: v for k, v in value.items() if k not in SPEC_KEYS}  # init args given without init_args
        for key, inner in [*init.items(), *loose.items()]:
            where_key = [*path, "init_args", str(key)] if key in init else [*path, str(key)]
            if key not in arguments:
                near = nearest(str(key), list(arguments))
                self.fail(where, where_key, f"unknown key {'.'.join(where_key)} ({cls.__name__} takes no {key!r})"
                          + (f"; did you mean {'.'.join([*where_key[:-1], near])}?" if near else ""))
            choices = literal_choices(arguments[key])
            if choices is not None and isinstance(inner, str) and inner not in choices:
                near = _near(inner, choices)
                self.fail(where, where_key, f"{'.'.join(where_key)}: {inner!r} is not one of {', '.join(choices)}"
                          + (f"; did you mean {near}?" if near else ""))
            nested = _class_of(arguments[key])
            if isinstance(inner, (dict, str)) and nested is not None and not nested.__module__.startswith("builtins") \
                    and (isinstance(inner, dict) and ("class_path" in inner or "init_args" in inner)):
                self.spec(inner, [*path, "init_args", str(key)], nested, where)


def check_config_files(args: Sequence[str], keys: set[str], subclasses: dict[str, type]) -> None:
    """Raise a CommandLineError naming the file, line and key of the first unknown key or class path in the
    ``--config`` files of ``args`` (in order), or of a class path given on the command line."""
    checker = _Checker(keys, subclasses)
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        following = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        value = inline if eq else following
        i += 1 if eq or following is None else 2
        if name in ("--config", "-c") and value is not None:
            data = read_config_file(value)
            if isinstance(data, dict):
                for key, inner in data.items():
                    checker.walk(inner, [str(key)], value)
        elif name.startswith("--") and value is not None:
            key = name[2:]
            group = key.split(".")[0]
            if group in subclasses and key in (group, f"{group}.class_path"):
                checker.spec({"class_path": value}, [group], subclasses[group], "the command line")


def run_function_command(function: Any, prog: str, description: str, args: Sequence[str] | None,
                         skip: set[str] = frozenset(), run: Any = None, extra: dict[str, dict] | None = None) -> Any:
    """``function`` as a command line (evaluate.py, mine.py): its typed arguments as options (but those in
    ``skip``), ``--config FILE``, config-file errors that name the file and line, and an unknown or abbreviated
    option as one error line. ``extra`` adds options of the command's own (``add_argument``'s keywords); ``run``
    (default ``function``) is called with every parsed option."""
    import sys
    from argparse import ArgumentError

    from jsonargparse import ActionConfigFile, ArgumentParser

    from .arguments import explain, help_formatter

    parser = ArgumentParser(prog=prog, exit_on_error=False, allow_abbrev=False, description=description,
                            formatter_class=help_formatter())
    parser.add_argument("--config", action=ActionConfigFile, help="options from a YAML file")
    parser.add_function_arguments(function, as_positional=False, skip=set(skip))
    for name, keywords in (extra or {}).items():
        parser.add_argument(name, **keywords)
    argv = sys.argv[1:] if args is None else list(args)
    check_config_files(argv, {str(k) for k in parser.get_defaults().keys()}, {})
    try:
        config = parser.parse_args(argv)
    except ArgumentError as err:
        raise CommandLineError(explain(err, argv, parser.parse_args)) from None
    return (run or function)(**{k: v for k, v in vars(config).items() if k != "config"})
