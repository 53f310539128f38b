"""`iattn inspect`: what trained attention does. For each run: its attention patterns on a prompt (every
layer and head, one figure) and the singular values of every head's W_Q W_K^T and W_V W_O (the
gauge-invariant quantities I-Attention parameterizes), runs side by side (spectra.png, spectra.md).
Built on the model directly (`iattention.model.activations.run_with_cache`), for every variant of both
families (GPT-2 and Llama: a grouped layer's spectra are per query head, with its group's key/value head)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from iattention.errors import UserError
from iattention.interop.load import model_and_tokenizer
from iattention.model.activations import canonical_view, run_with_cache
from iattention.symmetry.spectra import effective_rank, head_spectra
from iattention.utils.atomic import write_text, write_with
from iattention.utils.outputs import claim_outputs, starts_with


def _pyplot():
    import matplotlib  # lazy: heavy, only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png", bbox_inches="tight"))
    _pyplot().close(fig)
    return path


def pattern_figure(pattern_of, labels: list[str], L: int, H: int, title: str):
    """One panel per (layer, head): pattern_of(layer) is (H, T, T) attention weights."""
    fig, axes = _pyplot().subplots(L, H, figsize=(1.9 * H + 1, 1.9 * L + 0.6), squeeze=False)
    for layer in range(L):
        pattern = pattern_of(layer)
        for h in range(H):
            ax = axes[layer][h]
            im = ax.imshow(pattern[h], cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {layer}\nquery", fontsize=8)
            if layer == L - 1:
                ax.set_xlabel("key", fontsize=8)
    if len(labels) <= 16 and H <= 4:  # readable token labels on the first column / last row
        for layer in range(L):
            axes[layer][0].set_yticks(range(len(labels)), [repr(t)[1:-1] for t in labels], fontsize=6)
        for h in range(H):
            axes[L - 1][h].set_xticks(range(len(labels)), [repr(t)[1:-1] for t in labels], fontsize=6, rotation=90)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=min(1.0, 0.9 / L + 0.3), pad=0.02,
                 label="attention weight")
    fig.suptitle(title, fontsize=9)
    return fig


def short(text: str, limit: int = 60) -> str:
    """A prompt for a figure title: its repr, cut to about `limit` characters with an ellipsis."""
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 1] + "…"


def head_colors(n_head: int) -> list:
    """One colour per head from a qualitative palette (tab10, tab20), so neighbouring heads differ; past
    20 heads, evenly spaced colours of a continuous map."""
    plt = _pyplot()
    if n_head <= 20:
        palette = plt.get_cmap("tab10" if n_head <= 10 else "tab20")
        return [palette(h) for h in range(n_head)]
    return [plt.get_cmap("turbo")(h / (n_head - 1)) for h in range(n_head)]


def spectra_figure(names: list[str], spectra: list[list[dict]]):
    """Per run a column: the singular values of every head's W_Q W_K^T (top) and W_V W_O (bottom). Colour
    = head (a qualitative palette, so neighbouring heads differ), line style = layer."""
    import matplotlib.ticker  # lazy: matplotlib, only when a figure is drawn

    plt = _pyplot()
    fig, axes = plt.subplots(2, len(names), figsize=(4.6 * len(names), 7), squeeze=False, sharey="row")
    styles = ["-", "--", ":", "-."]
    for col, (name, layers) in enumerate(zip(names, spectra)):
        n_head = layers[0]["qk"].shape[0]
        colors = head_colors(n_head)
        for row, key in enumerate(("qk", "ov")):
            ax = axes[row][col]
            for layer, s in enumerate(layers):
                sv = s[key].numpy()
                for h in range(sv.shape[0]):
                    ax.plot(np.arange(1, sv.shape[1] + 1), sv[h], color=colors[h], ls=styles[layer % len(styles)],
                            lw=0.9, alpha=0.85, label=f"head {h}" if layer == 0 else None)
            for layer in range(min(len(layers), len(styles))):
                ax.plot([], [], color="gray", ls=styles[layer], label=f"layer {layer}"
                        + (f" (+{len(styles)}k)" if len(layers) > len(styles) else ""))
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            if row == 1:
                ax.set_xlabel("singular value index (per head, largest first)")
            ax.set_title(f"{name}\n{'W_Q W_Kᵀ' if key == 'qk' else 'W_V W_O'}", fontsize=9)
            ax.grid(alpha=0.3)
        axes[0][col].legend(fontsize=6, ncol=2 if n_head > 6 else 1)
    axes[0][0].set_ylabel("singular value (log)")
    axes[1][0].set_ylabel("singular value (log)")
    fig.subplots_adjust(hspace=0.3)
    return fig


SPECTRA_HEADER = "# Head spectra (`iattn inspect`"  # how spectra.md begins


def spectra_table(names: list[str], spectra: list[list[dict]], prompt: str) -> str:
    lines = [f"{SPECTRA_HEADER}, prompt {prompt!r})", "",
             "Per layer, mean over heads: the largest singular value and the effective rank (participation "
             "ratio (Σs)²/Σs², between 1 and r) of each head's W_Q W_Kᵀ and W_V W_O. Gauge-invariant: a standard "
             "model and its exact canonical form give the same numbers.", "",
             "| run | layer | QK top | QK eff. rank | OV top | OV eff. rank |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, layers in zip(names, spectra):
        for layer, s in enumerate(layers):
            lines.append(f"| {name} | {layer} | {s['qk'][:, 0].mean():.3g} | {effective_rank(s['qk']).mean():.2f} | "
                         f"{s['ov'][:, 0].mean():.3g} | {effective_rank(s['ov']).mean():.2f} |")
    return "\n".join(lines) + "\n"


def run_names(runs: list[str]) -> list[str]:
    """A distinct file-name stem per run: its folder's name (a checkpoint's stem), with as many of the folders
    above it, joined by "-", as tell the runs apart (a/r and b/r: a-r and b-r). A UserError for two runs
    that no folder tells apart (one run given twice)."""
    keys = []
    for run in runs:
        path = Path(run).resolve()
        parts = path.relative_to(path.anchor).parts
        keys.append((*parts[:-1], path.name if path.is_dir() else path.stem))
    for depth in range(1, max(len(key) for key in keys) + 1):
        names = ["-".join(key[-depth:]) for key in keys]
        if len(set(names)) == len(names):
            return names
    first = {}
    for run, name in zip(runs, names):
        if name in first:
            raise UserError(f"{first[name]} and {run} would both write {name}-attention.png; give each run once "
                            "(or inspect them into separate --out folders)")
        first[name] = run
    return names


def _canonical_views(loaded, notify) -> list[dict | None]:
    """Each run's canonical view (None for a run that has none, said by `notify` in one line each); a
    UserError when no run has one."""
    views, refusals = [], []
    for run, model, _ in loaded:
        try:
            views.append(canonical_view(model))
        except UserError as e:
            views.append(None)
            refusals.append((run, e))
    if len(refusals) == len(loaded):
        if len(loaded) == 1:
            raise refusals[0][1]
        raise UserError(f"the {len(loaded)} runs have no canonical view (only canonical models do); make one "
                        "with iattn convert --to canonical, or leave out --canonical")
    for run, e in refusals:
        notify(f"note: {run} has no canonical view, so only its patterns and spectra are written ({e})")
    return views


def _save_view(view: dict, path: Path, name: str) -> Path:
    from safetensors.torch import save_file  # lazy: only with --canonical

    # each tensor its own contiguous copy: safetensors refuses tensors that share memory, and the view's
    # are views (one head's W is W_QK[0], W_O's blocks are transposes)
    view = {k[len("blocks."):]: t.clone(memory_format=torch.contiguous_format) for k, t in view.items()}
    write_with(path, lambda tmp: save_file(view, str(tmp), metadata={"run": name}))
    return path


def inspect_runs(runs: list[str], prompt: str, out: str | Path, data_dir: str | None = None,
                 notify=lambda line: print(line, file=sys.stderr), canonical: bool = False,
                 tokenizer: str | None = None) -> list[Path]:
    """Figures and spectra.md for each run; a prompt longer than a model's block size is cut to it, and
    `notify` says so. Files are named by `run_names` (distinct). `canonical`: also the canonical view
    (`model.activations.canonical_view`: per head the learned and fixed blocks of W_K and W_O, W_Q, W_V,
    W_QK; W at one head) by name in `<run>-canonical.safetensors` of each run that has one (`notify` names
    the others; a UserError when none has). Every run is read and every refusal decided before any file is
    written. `tokenizer`: the spec every run is read with (`iattn inspect --tokenizer`), else each run's own."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder")
    loaded = [(run, *model_and_tokenizer(run, data_dir, tokenizer)) for run in runs]
    names = run_names(runs)
    views = _canonical_views(loaded, notify) if canonical else [None] * len(loaded)
    seen = []  # per run: (title name, token ids, cache, spectra), all decided before writing
    for (run, model, tok), name in zip(loaded, names):
        ids = tok.encode(prompt)
        if len(ids) > model.config.block_size:
            notify(f"note: the prompt has {len(ids)} tokens; {run} has block size {model.config.block_size}, "
                   f"so its first {model.config.block_size} tokens are inspected")
            ids = ids[: model.config.block_size]
        if len(ids) == 0:
            raise UserError("--prompt is empty after tokenization; give some text")
        _, cache = run_with_cache(model, torch.as_tensor(ids)[None])
        c = model.config
        kv = getattr(c, "n_kv_head", c.n_head)  # the Llama family: grouped-query attention
        heads = f"{c.n_head} head{'s' * (c.n_head > 1)}"
        if kv != c.n_head:
            heads += f", {kv} key/value head{'s' * (kv > 1)}"
        seen.append((f"{name} ({c.attention}, {heads})", ids, cache,
                     [head_spectra(attn.to_heads()) for attn in model.attention_layers]))
    # an older inspect's folder (no list of what it wrote): its files are ours where its spectra.md is
    claim_outputs(out, [*(f"{n}-canonical.safetensors" for n, v in zip(names, views) if v is not None),
                        *(f"{n}-attention.png" for n in names), "spectra.png", "spectra.md"],
                  lambda path: starts_with(path.parent / "spectra.md", SPECTRA_HEADER.encode()))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for (_, model, tok), name, view, (title, ids, cache, _) in zip(loaded, names, views, seen):
        if view is not None:
            written.append(_save_view(view, out / f"{name}-canonical.safetensors", name))
        c = model.config
        fig = pattern_figure(lambda layer, cache=cache: cache[f"blocks.{layer}.attn.hook_pattern"][0].float().numpy(),
                             [tok.decode([i]) for i in ids], c.n_layer, c.n_head,
                             f"attention patterns: {title}\nprompt {short(prompt)} ({len(ids)} tokens; "
                             "row = query, column = key, colour = weight 0..1)")
        written.append(_save(fig, out / f"{name}-attention.png"))
    titles, spectra = [t for t, *_ in seen], [s for *_, s in seen]
    written.append(_save(spectra_figure(titles, spectra), out / "spectra.png"))
    write_text(out / "spectra.md", spectra_table(titles, spectra, prompt))
    return written + [out / "spectra.md"]
