"""Claims ledger: sympy/numpy verdicts on every claim of arXiv 2604.13088.

Each claim gets a record (``claim.Claim``): id, source, statement, conditions, method, verdict
(holds / holds-under-conditions / fails) and evidence. Checks run symbolically (sympy, exact
rationals) and on real softmax tables with autograd through ``dfpo.policy_loss``.

    dfpo theory [--json PATH] [--markdown PATH] [--only ID ...] [--verbose]

Modules (flat):
    claim          the record type and the three verdicts
    tabular        softmax-table groups (shared context-token pair, prefix tries) on the loss core
    cancellation   eq 9, eq 10, eq 13, Cor. 3.3, sec. 4.4.1, Cor. H.1
    drift          Prop. 3.1, Cor. 3.2, Cor. 3.4, eq 74, Cor. G.1
    gradients      eqs 15/58/66/67 (GSPO and GRPO gradient forms)
    appendix_a     the toy problem: eqs 30, 38, 41
    clipping       eq 49, Cor. F.1, eqs 75-76, eq 81, App. H.3
    transforms     eq 18, eq 51, eq 55, Thm. C.1, Thm. K.1, eq 23, Table 3 ablations
    bias           eqs 92, 93, 96 and App. K.3-K.4
    stapo          STAPO's gradient-norm identity, its bounds, its mask against cancellation
    ledger         registry, run_ledger, table / JSON / markdown rendering, count_line
    cli            ``dfpo theory``
"""
