"""The user docs hold together: every link from README.md into docs/*.md names an existing file
and, where it names a section, a heading of that file (GitHub's anchors); every row of README's
"What works, and how fast" links its figure to a section of docs/benchmarks.md; and README
carries no issue numbers or history."""
import re

from conftest import ROOT

LINK = re.compile(r"\]\(((?:docs/)?[\w./-]+\.md)(?:#([^)]+))?\)")


def anchor(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # (\w keeps letters of any script, digits and _)
    return text.replace(" ", "-")


def anchors(path):
    out, seen = set(), {}
    for line in path.read_text().splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            a = anchor(m.group(1))
            n = seen.get(a, 0)
            out.add(a if n == 0 else f"{a}-{n}")
            seen[a] = n + 1
    return out


def test_the_anchor_rule_matches_githubs_on_known_headings():
    assert anchor("Neural-network quantum states (sci.nnqs)") == "neural-network-quantum-states-scinnqs"
    assert anchor("Seed 001's Table I (lossy GBS, d = 15)") == "seed-001s-table-i-lossy-gbs-d--15"


def test_readme_links_into_docs_resolve():
    readme = (ROOT / "README.md").read_text()
    wrong = []
    for target, section in LINK.findall(readme):
        path = ROOT / target
        if not path.is_file():
            wrong.append(f"{target}: no such file")
        elif section and section not in anchors(path):
            wrong.append(f"{target}#{section}: no such section")
    assert not wrong, "\n".join(wrong)


def test_every_row_of_what_works_links_a_benchmark_section():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## What works, and how fast", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| family", "| ---"))]
    assert len(rows) >= 7, rows
    sections = anchors(ROOT / "docs" / "benchmarks.md")
    for row in rows:
        links = [s for t, s in LINK.findall(row) if t == "docs/benchmarks.md"]
        assert links, f"no benchmark link in: {row[:80]}"
        for s in links:
            assert s in sections, f"docs/benchmarks.md has no section #{s}"


def test_readme_has_no_issue_numbers():
    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"\bissues? \d+", readme, re.I), re.search(r".{40}\bissues? \d+.{20}", readme, re.I).group(0)
