#!/usr/bin/env bash
# Reports of the issue 19 §5-7 follow-up (results/cpu-study/run-followup.sh), one per declared comparison:
# each arm against its control at the same head count, paired by seed, ±2% equivalence margin, Holm over
# the comparison's head counts. Runs that have not landed are simply absent from a report.
# Usage: bash results/cpu-study/followup-report.sh [IATTN]   (repository root; default .venv/bin/iattn)
set -uo pipefail
cd "$(dirname "$0")/../.."
IATTN=${1:-.venv/bin/iattn}
R=results/cpu-study/runs
F=results/cpu-study/followup
report() {  # report OUT REFERENCE FAMILY TITLE RUN_GLOB...
    local out=$1 ref=$2 fam=$3 title=$4; shift 4
    local runs=()
    for g in "$@"; do for d in $g; do [ -f "$d/summary.json" ] && runs+=("$d"); done; done
    if [ ${#runs[@]} -eq 0 ]; then echo "$out: no finished runs yet"; return; fi
    "$IATTN" report "${runs[@]}" --out "$F/$out" --reference "$ref" --margin 2 --family "$fam" --title "$title"
}
report rmslr-gpt2-init standard-rmslr canonical-rmslr,identity_ko-rmslr \
    "cpu-study §5: the per-group rule on GPT-2-init canonical and identity_ko" \
    "$R/standard-rmslr-h1-s[012]" "$R/standard-rmslr-h8-s[012]" "$R/canonical-rmslr-h*" "$R/identity_ko-rmslr-h*"
report iso-param standard-rmslr canonical-matched-rmslr-iso \
    "cpu-study §6: iso-parameter I-Attention (saved parameters in the MLP)" \
    "$R/standard-rmslr-h1-s[012]" "$R/canonical-matched-rmslr-h1-s[012]" "$R/canonical-matched-rmslr-iso-h*"
report ep40 standard-ep40 canonical-ep40 "cpu-study §5: 40 epochs instead of 16" \
    "$R/standard-ep40-h*" "$R/canonical-ep40-h*"
report muon standard-muon canonical-matched-muon "cpu-study §7: Muon instead of AdamW" \
    "$R/standard-muon-h*" "$R/canonical-matched-muon-h*"
