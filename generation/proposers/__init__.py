"""Proposers draft tokens for the target to verify: a draft model, or n-gram prompt lookup."""

from generation.proposers.base import Drafts, Proposer
from generation.proposers.draft_model import propose_with_draft_model
from generation.proposers.ngram import NgramProposer

__all__ = ["Drafts", "Proposer", "NgramProposer", "propose_with_draft_model"]
