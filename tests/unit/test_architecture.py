"""Repo-wide checks."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from torch import nn

from iattention.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


PACKAGE = ROOT / "src" / "iattention"


def layers() -> dict[str, int]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S).group(1)
    return {name: level for level, line in enumerate(block.splitlines()) for name in line.split()}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the iattention modules it imports, wherever the import statement stands."""
    edges = defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                    "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                targets = [str(node.args[0].value)]
            for t in targets:
                if t == "iattention" or t.startswith("iattention."):
                    while t not in mods:  # `import iattention.a.b.c` where c is a name: its module
                        t = t.rpartition(".")[0]
                    if t != name:
                        edges[name].add(t)
    return edges


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "iattention"


# ----------------------------------------------- a variant is one file + its registry lines (+ its name in the docs)
def _toy_class():
    """A variant defined here and nowhere else: queries and keys share one projection (a symmetric score
    matrix per head), V and O are learned. Not the full class of standard attention."""
    from iattention.attention.base import CausalSelfAttention, column_blocks, row_blocks
    from iattention.attention.heads import HeadWeights, fused_to_heads, heads_to_fused, heads_to_out, out_to_heads

    class Toy(CausalSelfAttention):
        variant = "toy"

        def __init__(self, config):
            super().__init__(config)
            d = config.n_embd
            self.c_qv = nn.Linear(d, 2 * d, bias=config.bias)
            self.c_proj = nn.Linear(d, d, bias=config.bias)

        def qkv(self, x):
            q, v = self.c_qv(x).split(self.n_embd, dim=2)
            return q, q, v

        def project_out(self, y):
            return self.c_proj(y)

        def head_blocks(self):
            r, H = self.d_head, self.n_head
            return {"c_qv.weight": row_blocks((H, H), r), "c_proj.weight": column_blocks(r, H)}

        @classmethod
        def redundant_biases(cls, config):
            return ("b_V",) if config.bias else ()  # b_K is b_Q (tied): not droppable

        def to_heads(self):
            qv = fused_to_heads(self.c_qv, "QV", (self.n_head, self.n_head), self.d_head)
            return HeadWeights(W_K=qv["W_Q"], b_K=qv["b_Q"], **qv, **out_to_heads(self.c_proj, self.n_head))

        def load_heads(self, hw):
            if not torch.equal(hw.W_Q, hw.W_K):
                raise UserError("toy attention holds only heads with W_Q = W_K")
            heads_to_fused(self.c_qv, hw, "QV")
            heads_to_out(self.c_proj, hw)

    return Toy


def test_every_package_has_a_layer():
    missing = sorted({top(m) for m in modules()} - set(layers()))
    assert not missing, f"packages without a layer in docs/architecture.md: {missing}"


def test_no_upward_or_sideways_imports():
    level = layers()
    bad = [f"{a} -> {b}" for a, targets in imports(modules()).items() for b in targets
           if top(a) != top(b) and level[top(b)] >= level[top(a)]]
    assert not bad, "imports against the layering of docs/architecture.md:\n" + "\n".join(sorted(bad))


def test_no_import_circles():
    edges = imports(modules())
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in list(modules()):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_checker_sees_lazy_relative_and_by_name_imports(tmp_path):
    """The parser must catch the kinds of import that hid the old circles: inside a function, relative,
    and by name through importlib."""
    pkg = tmp_path / "iattention"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from iattention.sub.high import g\n")
    (pkg / "sub" / "high.py").write_text("from ..low import f\nimport importlib\n"
                                         "m = importlib.import_module('iattention.x')\n")
    (pkg / "x.py").write_text("def g():\n    import iattention.low\n")
    mods = {"iattention": pkg / "__init__.py", "iattention.sub": pkg / "sub" / "__init__.py",
            "iattention.low": pkg / "low.py", "iattention.sub.high": pkg / "sub" / "high.py",
            "iattention.x": pkg / "x.py"}
    edges = imports(mods)
    assert edges["iattention.low"] == {"iattention.sub.high"}
    assert edges["iattention.sub.high"] == {"iattention.low", "iattention.x"}
    assert edges["iattention.x"] == {"iattention.low"}


@pytest.mark.slow
def test_a_toy_variant_needs_no_other_file(monkeypatch):
    from iattention import GPT, GPTConfig
    from iattention.attention.registry import ATTENTION_REGISTRY, variant_names
    from iattention.bench.flops import attention_projection_flops
    from iattention.config import OptimConfig
    from iattention.symmetry import canonicalize, expand, param_count, redundancy
    from iattention.train.optim import build_optimizer

    monkeypatch.setitem(ATTENTION_REGISTRY, "toy", _toy_class())  # the one registry line
    assert "toy" in variant_names()
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=40, block_size=8, attention="toy")
    torch.manual_seed(0)
    model = GPT(cfg).double()
    # parameters: the closed form asks the class, and agrees with the model
    assert redundancy(cfg) == 2 * (16 * 16 + 16)
    assert param_count(cfg) == model.num_params()
    # FLOPs: 2 per matrix entry of Q,V (2 d^2) and O (d^2)
    assert attention_projection_flops(cfg) == 2 * 3 * 16 * 16
    # a smaller class: no matched init
    with pytest.raises(UserError, match="impossible"):
        GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=40, attention="toy", init="matched")
    # symmetry tools: expand and canonicalize keep the function; loading other heads is refused
    x = torch.randint(0, 40, (2, 8))
    with torch.no_grad():
        ref = model(x)[0]
        for moved in (expand(model), canonicalize(model, block="pivoted")):
            assert torch.allclose(moved(x)[0], ref, atol=1e-9)
        std = expand(model)
        std.attention_layers[0].c_attn.weight[16:32] += 0.1  # W_K no longer equals W_Q
        with pytest.raises(UserError, match="W_Q = W_K"):
            model.attention_layers[0].load_heads(std.attention_layers[0].to_heads())
    # a training step from the generic code
    model = GPT(cfg)
    opt = build_optimizer(model, OptimConfig(lr=1e-2), "cpu")
    before = model(x, x)[1]
    for _ in range(3):
        loss = model(x, x)[1]
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert model(x, x)[1] < before


def test_makefile_pins_torch():
    """Setup never installs an unpinned torch (which pulls several GB of CUDA wheels)."""
    import re
    from pathlib import Path

    make = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    default = re.search(r"^TORCH_PIP \?= (.+)$", make, flags=re.M).group(1)
    assert re.match(r"torch==\d+\.\d+\.\d+", default)
    assert "$(TORCH_PIP)" in make and not re.search(r"pip install[^\n]* torch(\s|$)", make)


# ---------------------------------------------------------- what a family is lives in its record, nowhere else
_FAMILY_TEST = re.compile(r"\b(family|model_type)\b[\w.\]\)\"']*\s*(==|!=|\bnot in\b|\bin\b)\s*[(\[{\"']")


def test_no_line_outside_the_records_tests_a_family_s_name():
    """`family == "qwen2"`, `model_type != "gpt2"`, `family in ("mistral", "qwen2")`: a family's facts belong in its
    record (config/families.py), which the code asks (`FAMILIES[f].window`); a name test spreads them again."""
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in PACKAGE.rglob("*.py")
             if path.name != "families.py" for n, line in enumerate(path.read_text().splitlines(), 1)
             if _FAMILY_TEST.search(line.split("#")[0])]
    assert not found, "\n".join(found)


# ---------------------------------------------------------------- a relayed message is cut at a word, never inside one
def test_a_relayed_message_is_cut_at_a_word_and_says_so():
    """transformers' 'look at the above r' (issue 67 §3): errors.first_words cuts the first line at a space."""
    from iattention.errors import first_words

    text = "Error(s) in loading state_dict: size mismatch for weight, look at the above report for details " * 3
    cut = first_words(ValueError(text + "\nsecond line"), 100)
    assert cut.endswith(" ...") and text.startswith(cut.removesuffix(" ...")) and len(cut) <= 104
    assert text[len(cut.removesuffix(" ..."))] == " "  # the next character was a space: no word was split
    assert first_words(ValueError("short\nsecond")) == "short" and first_words(KeyError()) == "KeyError"
    found = [f"{p.relative_to(ROOT)}:{n}" for p in PACKAGE.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"splitlines\(\)\[0\]\[:\d+\]", line)]
    assert not found, f"a message cut by characters (use errors.first_words): {found}"
