"""The I-Attention paper's published numbers (Sivaraman, Mongkolsupawan, Sankar: "I-Attention", CMU 10-623
Generative AI course project): GPT-2 small, WikiText-2, 40 epochs, batch 32, one seed, as published there.
Not ours; reports quote them beside our runs."""

PAPER = {
    "heads": [1, 4, 8, 12],
    "standard": {"best_val_ppl": [345, 291, 297, 295], "best_epoch": [30, 20, 20, 19]},
    "canonical": {"best_val_ppl": [234, 292, 258, 248], "best_epoch": [6, 19, 9, 8]},
}
