"""Proposers draft tokens for the target to verify: a draft model, or n-gram prompt lookup."""

from generation.proposers.base import Draft, Proposer
from generation.proposers.draft_model import DraftModelProposer
from generation.proposers.ngram import NgramProposer, find_continuation

__all__ = ["Draft", "DraftModelProposer", "NgramProposer", "Proposer", "find_continuation"]
