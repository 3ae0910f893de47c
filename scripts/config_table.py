"""The configuration tables, generated from the config dataclasses: the settings (README.md) and the internal fields
(docs/configuration.md).

    python scripts/config_table.py                  # print the settings' markdown table
    python scripts/config_table.py --internal       # print the internal fields' table
    python scripts/config_table.py --check README.md  # exit 1 with a diff when README's table is out of date
    python scripts/config_table.py --internal --check docs/configuration.md

Keys, defaults and docs come from the code, so a table cannot drift from it: the keys and defaults from the
dataclasses (`VoxServeConfig`, the dataclasses nested in it, and `SchedulerPolicyConfig` under `scheduler`), the
defaults as a server without any setting resolves them; which keys are settings from `config.SETTINGS`; the doc of a
key from the comment at the end of its line in the source or, where there is none, the comment block directly above
it: its first sentence, trimmed.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import enum
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any, Iterator

START = "<!-- config-table:start -->"
END = "<!-- config-table:end -->"
DOC_CHARS = 100
# Fields whose value is a plain mapping parsed elsewhere: the method of the parent that returns the parsed dataclass.
MAPPING_SECTIONS = {"scheduler": "scheduler_policy"}


# --- comments ---------------------------------------------------------------------------------------------------

def field_comments(source: str, class_name: str) -> dict[str, str]:
    """The raw comment of each annotated field of `class_name` in `source`: the comment at the end of the field's
    line(s), else the block of comment-only lines directly above it (joined) unless that only names a group of
    fields, else ""."""
    tree = ast.parse(source)
    cls = next((node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == class_name), None)
    if cls is None:
        raise ValueError(f"class {class_name} not found")
    trailing: dict[int, str] = {}  # line -> comment after code on that line
    alone: dict[int, str] = {}  # line -> comment on a line of its own
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            (alone if not tok.line[:tok.start[1]].strip() else trailing)[tok.start[0]] = text
    docs: dict[str, str] = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        after = [trailing[line] for line in range(node.lineno, end + 1) if line in trailing]
        if after:
            docs[node.target.id] = " ".join(after)
            continue
        above, line = [], node.lineno - 1
        while line in alone:
            above.insert(0, alone[line])
            line -= 1
        text = " ".join(above)
        docs[node.target.id] = "" if is_section_header(text) else text
    return docs


def is_section_header(comment: str) -> bool:
    """A comment that names a group of fields ("overload", "LM lane") rather than documenting the one below it."""
    return len(comment.split()) <= 3 and not re.search(r"[.:;,()=]", comment)


def one_line(comment: str, limit: int = DOC_CHARS) -> str:
    """The first sentence of a comment, cut at a word to about `limit` characters, safe inside a table cell."""
    text = " ".join(comment.split())
    match = re.search(r"(?<=[.!?])\s+(?=[A-Z(`\"'])", text)
    if match:
        text = text[:match.start()]
    if len(text) > limit:
        cut = text[:limit].rsplit(" ", 1)[0].rstrip(",;:(")
        text = cut + " …"
    return text.replace("|", "\\|")


def class_comments(cls: type) -> dict[str, str]:
    """The field comments of a dataclass, its inherited fields' from the class that declares them."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(field_comments(Path(inspect.getsourcefile(klass)).read_text(), klass.__name__))
    return docs


# --- rows -------------------------------------------------------------------------------------------------------

def format_value(value: Any) -> str:
    def plain(v: Any) -> Any:
        if isinstance(v, enum.Enum):
            return plain(v.value)
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return v

    try:
        return f"`{json.dumps(plain(value))}`"
    except TypeError:
        return f"`{value!r}`"


def rows(instance: Any, prefix: str = "", skip: frozenset[str] = frozenset()) -> Iterator[tuple[str, str, str]]:
    """(key, default, doc) for each field of the dataclass `instance`, nested dataclasses and mapping sections as
    `parent.key`."""
    cls = type(instance)
    docs = class_comments(cls)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        key, value = prefix + field.name, getattr(instance, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from rows(value, key + ".")
        elif field.name in MAPPING_SECTIONS and hasattr(instance, MAPPING_SECTIONS[field.name]):
            parsed = getattr(instance, MAPPING_SECTIONS[field.name])()
            yield from rows(parsed, key + ".", frozenset(mirrored_keys()))
        else:
            yield key, format_value(value), one_line(docs.get(field.name, ""))


def mirrored_keys() -> tuple[str, ...]:
    """Policy keys set at the top level or derived (the scheduler section refuses them)."""
    from vllm_voxserve import config

    return tuple(getattr(config, "_POLICY_FROM_TOP_LEVEL", ())) + tuple(getattr(config, "_POLICY_DERIVED", ()))


def table(instance: Any, keys: frozenset[str] | None = None) -> str:
    """The markdown table of `instance`'s fields, of those named in `keys` only where given."""
    lines = ["| key | default | what it sets |", "|---|---|---|"]
    lines += [f"| `{key}` | {default} | {doc} |" for key, default, doc in rows(instance) if keys is None or key in keys]
    return "\n".join(lines) + "\n"


def config_table(internal: bool = False) -> str:
    """The settings' table, or with `internal` the table of every other field."""
    from vllm_voxserve.config import SETTINGS, VoxServeConfig, field_keys

    return table(VoxServeConfig(), field_keys() - SETTINGS if internal else SETTINGS)


# --- check ------------------------------------------------------------------------------------------------------

def embedded_table(text: str) -> str:
    """The text between the markers (without the marker lines)."""
    if START not in text or END not in text:
        raise ValueError(f"markers {START} and {END} not found")
    inner = text.split(START, 1)[1].split(END, 1)[0]
    return inner.strip("\n") + "\n"


def check(readme: Path, expected: str) -> int:
    try:
        actual = embedded_table(readme.read_text())
    except ValueError as exc:
        print(f"{readme}: {exc}", file=sys.stderr)
        return 1
    if actual == expected:
        return 0
    diff = difflib.unified_diff(actual.splitlines(True), expected.splitlines(True), f"{readme} (table)",
                                "generated from the code")
    sys.stdout.writelines(diff)
    print(textwrap.dedent(f"""
        {readme}'s configuration table differs from the code: run
        `python scripts/config_table.py [--internal] --write {readme}`."""), file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--internal", action="store_true", help="the internal fields' table, not the settings'")
    parser.add_argument("--check", metavar="FILE", type=Path, help="compare FILE's table with the code")
    parser.add_argument("--write", metavar="FILE", type=Path, help="replace FILE's table with the code's")
    args = parser.parse_args(argv)
    expected = config_table(args.internal)
    if args.check:
        return check(args.check, expected)
    if args.write:
        text = args.write.read_text()
        embedded_table(text)  # raises where the markers are missing
        head, rest = text.split(START, 1)
        args.write.write_text(f"{head}{START}\n{expected}{END}{rest.split(END, 1)[1]}")
        return 0
    sys.stdout.write(expected)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
