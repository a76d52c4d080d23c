"""Write ``gpufleet/evidence_stored.py``: each finding kind's evidence as stored, from its shapes as written.

``gpufleet/evidence.py`` declares what the detectors write, one ``TypedDict``
per shape.  An incident's stored evidence may predate a key or have been
written by hand, so readers take it as the same keys with none required.
Python's typing has no "every key optional" operator over a ``TypedDict``,
and mypy checks a reader's ``ev.get("clock_ratio")`` only against a view it
reads as source: so that view is written out as a module, rendered from the
written shapes by this script, never restated by hand.  For each kind of
``EVIDENCE_TYPES`` it renders a ``total=False`` ``TypedDict`` with every key
of the kind's shapes (in order of first appearance), a view of the same kind
for each nested ``GPU_ENTRIES`` shape, and ``STORED_TYPES``; the text is
passed through ``ruff format`` (a dev dependency), so ``make lint`` accepts it
as written.  ``tests/detectors/test_evidence.py`` fails when the committed
module differs from what this renders.

    python tools/gen_evidence_views.py           # rewrite the module
    python tools/gen_evidence_views.py --check   # exit 1, with the diff, when it differs
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import subprocess
import sys
import textwrap
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Union, is_typeddict

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "gpufleet" / "evidence_stored.py"
LINE_LENGTH = 110

HEADER = '''\
"""Each finding kind's evidence as stored: its shapes as written, with every key optional.

Generated from gpufleet/evidence.py by tools/gen_evidence_views.py: do not edit it by hand.  Change
the shapes there and run ``python tools/gen_evidence_views.py``; tests/detectors/test_evidence.py
fails while this module differs from what the script renders.

It is source because mypy checks a reader of stored evidence (``ev.get("clock_ratio")`` as
``float | None``, a misspelt key an error) only against a view it reads as source, and Python's
typing has no "every key optional" operator to derive one from a ``TypedDict``.  A GPU's own entry
in a list (``gpufleet.evidence.GPU_ENTRIES``) has a stored view of its own; the other nested shapes
are kept as written.

gpufleet.evidence imports these views (readers import them from there), so this module imports
nothing from it: the nested shapes kept as written (``JobQuota``, ...) are copied here, with the
same keys, types and required keys.  No ``from __future__ import annotations``, as there: Python
3.11 reads ``NotRequired`` only off evaluated annotations.
"""
'''


def load_written_shapes() -> ModuleType:
    """``gpufleet.evidence``, loaded without the module this script writes.

    ``gpufleet.evidence`` imports ``gpufleet.evidence_stored``, which may be missing or not importable
    when the views are to be rendered: a placeholder stands in for it while ``gpufleet.evidence``
    loads, so the written shapes alone decide what renders.  Where ``gpufleet.evidence`` is loaded
    already (a test), that module is the one read.
    """
    name = "gpufleet.evidence_stored"
    if "gpufleet.evidence" in sys.modules:
        return importlib.import_module("gpufleet.evidence")
    placeholder = ModuleType(name)
    vars(placeholder)["__getattr__"] = lambda attr: dict  # each name imported from it: some class
    sys.modules[name] = placeholder
    try:
        return importlib.import_module("gpufleet.evidence")
    finally:
        del sys.modules[name]


evidence = load_written_shapes()


def stored_name(kind: str) -> str:
    """``host_misconfig`` -> ``StoredHostMisconfig``."""
    return "Stored" + "".join(part.capitalize() for part in kind.split("_"))


def merged_keys(name: str, shapes: Iterable[Any]) -> dict[str, Any]:
    """Every key of ``shapes`` with its type, in order of first appearance; one key of two types is an error
    (the stored view could not say which)."""
    out: dict[str, Any] = {}
    for tp in shapes:
        for key, ann in typing.get_type_hints(tp).items():
            if out.setdefault(key, ann) != ann:
                raise TypeError(f"{name}: {key!r} is {out[key]} in one shape and {ann} in {tp.__name__}")
    return out


def _literal(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool | int):
        return repr(value)
    raise TypeError(f"no source text for the literal {value!r}")


def _shapes(tps: Iterable[Any]) -> str:
    return " and ".join(f"``{tp.__name__}``" for tp in tps)


class _Module:
    """The classes rendered so far, each after the ones it nests, and the typing names they use."""

    def __init__(self, entries: tuple[Any, ...]) -> None:
        self.entries = entries
        self.blocks: list[str] = []
        self.names: dict[tuple[Any, bool], str] = {}
        self.typing_names: set[str] = {"Any", "TypedDict"}

    def annotation(self, tp: Any, stored: bool) -> str:
        """``tp`` as source text; in a stored view (``stored``) a GPU entry is its stored view."""
        if tp is None or tp is type(None):
            return "None"
        if tp is Ellipsis:
            return "..."
        if tp is Any:
            return "Any"
        origin = typing.get_origin(tp)
        if origin is Union or origin is types.UnionType:
            return " | ".join(self.annotation(arm, stored) for arm in typing.get_args(tp))
        if origin is Literal:
            self.typing_names.add("Literal")
            return f"Literal[{', '.join(_literal(a) for a in typing.get_args(tp))}]"
        if origin in (list, dict, set, frozenset, tuple):
            args = ", ".join(self.annotation(a, stored) for a in typing.get_args(tp))
            return f"{origin.__name__}[{args}]"
        if is_typeddict(tp):
            return self.nested(tp, stored and tp in self.entries)
        if tp in (int, float, str, bool):
            return str(tp.__name__)
        raise TypeError(f"no source text for the annotation {tp!r}")

    def nested(self, tp: Any, stored: bool) -> str:
        """The name here of a nested shape's class (its stored view, or its copy as written), rendering
        the class the first time it is named."""
        if tp.__module__ != evidence.__name__:
            raise TypeError(f"{tp.__qualname__}: a nested shape not declared in {evidence.__name__}")
        key = (tp, stored)
        if key not in self.names:
            name = self.names[key] = ("Stored" if stored else "") + tp.__name__
            if stored:
                doc = f"{_shapes([tp])} as stored (a GPU's entry in its kind's evidence): every key optional."
                self.add(name, doc, merged_keys(name, [tp]), stored=True)
            else:
                doc = f"``gpufleet.evidence.{tp.__name__}``, copied: the stored views keep it as written."
                self.add(name, doc, merged_keys(name, [tp]), stored=False, optional=tp.__optional_keys__)
        return self.names[key]

    def add(
        self, name: str, doc: str, keys: dict[str, Any], stored: bool, optional: Iterable[str] = ()
    ) -> None:
        """Render a class after the ones its fields name (a stored view has no required key)."""
        fields = []
        for key, ann in keys.items():
            text = self.annotation(ann, stored)
            if not stored and key in optional:
                self.typing_names.add("NotRequired")
                text = f"NotRequired[{text}]"
            fields.append(f"    {key}: {text}")
        lines = [f"class {name}(TypedDict, total=False):" if stored else f"class {name}(TypedDict):"]
        if len(f'    """{doc}"""') <= LINE_LENGTH:
            lines.append(f'    """{doc}"""')
        else:
            wrapped = textwrap.wrap(doc, LINE_LENGTH - 4, break_on_hyphens=False)
            lines += [f'    """{wrapped[0]}', *(f"    {w}" for w in wrapped[1:]), '    """']
        self.blocks.append("\n".join([*lines, "", *fields]) + "\n")


def render_unformatted() -> str:
    """The module's text as rendered, before ``ruff format``."""
    mod = _Module(tuple(evidence.GPU_ENTRIES))
    for kind, shapes in evidence.EVIDENCE_TYPES.items():
        doc = f"{_shapes(shapes)} as stored: every key optional."
        mod.add(stored_name(kind), doc, merged_keys(kind, shapes), stored=True)
    unused = [tp.__name__ for tp in mod.entries if (tp, True) not in mod.names]
    if unused:
        raise TypeError(f"GPU_ENTRIES names shapes no kind's evidence nests: {unused}")
    mapping = "".join(f"    {json.dumps(kind)}: {stored_name(kind)},\n" for kind in evidence.EVIDENCE_TYPES)
    return (
        HEADER
        + "\nfrom collections.abc import Mapping\n"
        + f"from typing import {', '.join(sorted(mod.typing_names))}\n\n\n"
        + "\n\n".join(mod.blocks)
        + "\n\n#: Each kind's evidence as stored (every key optional).\n"
        + "STORED_TYPES: Mapping[str, Any] = {\n"
        + mapping
        + "}\n"
    )


def render() -> str:
    """The module's text: as rendered, then as ``ruff format`` (with the project's settings) writes it."""
    text = render_unformatted()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(OUTPUT), "-"],
            input=text,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    except OSError as e:
        raise SystemExit(f"gen_evidence_views: could not run ruff ({e})") from e
    if proc.returncode != 0:
        raise SystemExit(f"gen_evidence_views: ruff format failed (ruff is a dev dependency):\n{proc.stderr}")
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Render gpufleet/evidence_stored.py (each finding kind's evidence as stored, every key "
        "optional) from the shapes declared in gpufleet/evidence.py.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with the difference when the committed module is not what renders now",
    )
    args = parser.parse_args(argv)
    text = render()
    rel = OUTPUT.relative_to(ROOT)
    if args.check:
        old = OUTPUT.read_text() if OUTPUT.exists() else ""
        if old == text:
            print(f"{rel} is up to date")
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(
                old.splitlines(keepends=True), text.splitlines(keepends=True), str(rel), "rendered"
            )
        )
        print(f"{rel} differs from what gpufleet/evidence.py renders: run python tools/gen_evidence_views.py")
        return 1
    OUTPUT.write_text(text)
    print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
