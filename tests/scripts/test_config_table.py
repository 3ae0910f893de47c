"""README.md's table of the settings and docs/configuration.md's table of the internal fields against the code
(scripts/config_table.py), and how the script reads keys, defaults and comments from a dataclass's source."""

import dataclasses
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "config_table.py"


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


config_table = load(SCRIPT, "config_table_under_test")

TINY = '''
import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Inner:
    # How deep the thing goes. Later sentences are not shown.
    depth: int = 2
    names: tuple = ("a", "b")  # trailing | with a pipe


@dataclasses.dataclass(frozen=True)
class Section:
    limit: float = 0.5  # a policy knob
    shared: int = 7  # set at the top level only


@dataclasses.dataclass(frozen=True)
class Tiny:
    # group header
    plain: int = 1
    # Block above,
    # over two lines.
    flag: bool = True  # the trailing comment wins
    long: str = "x"  # ''' + "word " * 40 + '''
    inner: Inner = Inner()
    section: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def section_policy(self) -> Section:
        return Section(**self.section)
'''


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    path = tmp_path / "tiny_config.py"
    path.write_text(TINY)
    module = load(path, "tiny_config")
    monkeypatch.setitem(config_table.MAPPING_SECTIONS, "section", "section_policy")
    monkeypatch.setattr(config_table, "mirrored_keys", lambda: ("shared",))
    yield module
    sys.modules.pop("tiny_config", None)


def test_comments_come_from_the_end_of_the_line_or_the_block_above():
    docs = config_table.field_comments(TINY, "Tiny")
    assert docs["plain"] == ""  # "group header" names a group, not this field
    assert docs["flag"] == "the trailing comment wins"
    assert config_table.field_comments(TINY, "Inner")["depth"] == "How deep the thing goes. Later sentences are not shown."
    assert config_table.field_comments(TINY, "Section") == {"limit": "a policy knob", "shared": "set at the top level only"}
    with pytest.raises(ValueError, match="Missing"):
        config_table.field_comments(TINY, "Missing")


def test_a_comment_becomes_one_short_table_cell():
    assert config_table.one_line("How deep the thing goes. Later sentences are not shown.") == "How deep the thing goes."
    assert config_table.one_line("Block above, over two lines.") == "Block above, over two lines."
    assert config_table.one_line("a | b") == "a \\| b"
    cut = config_table.one_line("word " * 40)
    assert len(cut) <= config_table.DOC_CHARS + 2 and cut.endswith(" …") and "wor …" not in cut


def test_rows_name_nested_keys_with_their_parents(tiny):
    rows = list(config_table.rows(tiny.Tiny(section={"limit": 0.25})))
    assert [key for key, _, _ in rows] == ["plain", "flag", "long", "inner.depth", "inner.names", "section.limit"]
    as_dict = {key: (default, doc) for key, default, doc in rows}
    assert as_dict["flag"] == ("`true`", "the trailing comment wins")
    assert as_dict["inner.names"] == ('`["a", "b"]`', "trailing \\| with a pipe")
    assert as_dict["inner.depth"] == ("`2`", "How deep the thing goes.")
    assert as_dict["section.limit"] == ("`0.25`", "a policy knob")  # the parsed section, not the raw mapping
    assert as_dict["plain"] == ("`1`", "")


def test_check_passes_on_the_same_table_and_fails_with_a_diff(tiny, tmp_path, capsys):
    table = config_table.table(tiny.Tiny())
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{config_table.START}\n{table}{config_table.END}\n\nmore\n")
    assert config_table.check(readme, table) == 0
    readme.write_text(readme.read_text().replace("`true`", "`false`"))
    assert config_table.check(readme, table) == 1
    assert "-| `flag` | `false`" in capsys.readouterr().out
    readme.write_text("# no markers\n")
    assert config_table.check(readme, table) == 1


@pytest.mark.parametrize("args", [["--check", "README.md"], ["--internal", "--check", "docs/configuration.md"]])
def test_the_documented_tables_match_the_code(args):
    result = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def keys_of(table: str) -> list[str]:
    return [line.split("`")[1] for line in table.splitlines()[2:]]


def test_the_settings_table_lists_the_settings_and_the_internal_one_every_other_field():
    from vllm_voxserve.config import SETTINGS, VoxServeConfig, field_keys

    settings, internal = keys_of(config_table.config_table()), keys_of(config_table.config_table(internal=True))
    assert set(settings) == SETTINGS and len(settings) == len(SETTINGS)
    assert set(internal) == field_keys() - SETTINGS and len(internal) == len(set(internal))
    for field in dataclasses.fields(VoxServeConfig):  # every top-level field, or a section's keys, is in one table
        assert any(key == field.name or key.startswith(field.name + ".") for key in settings + internal), field.name
