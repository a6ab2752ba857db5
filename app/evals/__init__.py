"""Evaluations that run the engine: the golden set (``golden``) and shadow baseline decodes
(``shadow``), with the after-answer hook that samples shadow runs (``hooks``). Their rows are
audit's tables (app/audit/records.py); app/audit only reads them.
"""
