"""The docs stay true: every name docs/architecture.md cites exists.

A contributor follows that page from ``torch.compile`` to the PJRT execute
call; a renamed or deleted function must fail here, not mislead them.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CITED = re.compile(r"`(tpu_inductor(?:\.\w+)+)`")


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(dotted)


NAMES = sorted(set(CITED.findall((ROOT / "docs" / "architecture.md").read_text())))


def test_the_architecture_page_cites_names():
    assert len(NAMES) > 30


@pytest.mark.parametrize("dotted", NAMES)
def test_every_cited_name_exists(dotted):
    _resolve(dotted)


def test_no_doc_links_outside_the_repository():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)", page.read_text()):
            assert not target.startswith(("http:", "https:")), f"{page.name} links {target}"
            assert (page.parent / target).resolve().is_relative_to(ROOT), f"{page.name} links {target}"
            assert (page.parent / target).exists(), f"{page.name} links missing {target}"
