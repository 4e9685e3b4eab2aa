"""The campaign ledger: one SQLite database (`profattr.ledger/1`) that keeps, for every capture of a campaign, its
identity, its run.json facts and its per-step budget, so experiments can be listed, compared and followed over time
without the captures at hand.

schema.py (tables, opening, transactions) -> record.py (`ledger add`) -> query.py (list, show, compare, trend).
The ledger stores budgets made by `attribute.budget` and compares them with `attribute.diff`; it computes neither.
"""
