"""docs/options.md is made from the option rows (tools/options_doc.py) and
kept current: a row added, removed or changed without regenerating the page
fails here."""
import importlib.util
import os

import upcall

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def generator():
    spec = importlib.util.spec_from_file_location("options_doc", os.path.join(ROOT, "tools", "options_doc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_option_page_is_generated_from_the_rows():
    gen = generator()
    with open(gen.PAGE, encoding="utf-8") as f:
        page = f.read()
    assert page == gen.render(), "docs/options.md is stale: run .venv/bin/python tools/options_doc.py"


def test_every_option_has_a_row_in_the_page():
    page = generator().render()
    for fields in (upcall.SubscribeOptions.fields, upcall.PublisherOptions.fields):
        for name, row in fields.items():
            assert f"| `{name}` | `{row.default!r}`" in page, name
