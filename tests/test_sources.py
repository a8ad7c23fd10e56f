"""Outside documents (papers, notes, other projects) are cited in one place, README § Sources;
a docstring, comment or setting description names its key (``README § Sources [GAE]``)."""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rlhf_core", "tasks", "flows", "data_checks", "bench")
CITATION = re.compile(
    r"\bet al\b|\b[A-Z][A-Za-z-]+,? (?:19|20)\d\d\b|https?://[\w.-]+\.[a-z]{2,}/"
    r"|InstructGPT|DeepSeekMath|OpenRLHF|\bOpenAI\b|lm-human-preferences|N\+ [Ii]mplementation")
KEY = re.compile(r"\[([A-Za-z][\w+-]+)\]")


def prose(path: Path):
    """(line, text) of every comment, docstring and ``description=`` string of a module."""
    source = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc
        elif isinstance(node, ast.keyword) and node.arg == "description" \
                and isinstance(node.value, ast.Constant):
            yield node.value.lineno, str(node.value.value)


def readme_keys() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Sources\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| \[([^\]]+)\] \|", section, flags=re.M))


def all_prose():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for line, text in prose(path):
                yield f"{path.relative_to(ROOT)}:{line}", text


def test_the_checker_finds_citations_and_keys():
    assert CITATION.search("as in Stiennon et al. 2020") and CITATION.search("(Ziegler 2019)")
    assert CITATION.search("see http://example.org/blog/kl.html")
    assert CITATION.search("the InstructGPT recipe")
    assert not CITATION.search(KEY.sub("", "the recipe (README § Sources [InstructGPT])"))
    assert {"PPO", "GAE", "N+"} <= readme_keys()


def test_no_code_prose_cites_an_outside_document():
    found = [f"{where}: {m.group(0)!r}" for where, text in all_prose()
             for m in CITATION.finditer(KEY.sub("", text))]
    assert not found, found


def test_every_cited_key_is_in_the_readme_and_every_row_is_cited():
    keys = readme_keys()
    cited = {}
    for where, text in all_prose():
        if "§ Sources" in text:
            for key in KEY.findall(text):
                cited.setdefault(key, where)
    unknown = {k: w for k, w in cited.items() if k not in keys}
    assert not unknown, unknown
    assert keys <= set(cited), sorted(keys - set(cited))
