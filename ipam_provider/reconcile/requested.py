"""Transitional alias: the requested-address notice is the claim reconciler's (`claims.py`). Remove this module once
tests/incluster/test_requested_address.py imports from `ipam_provider.reconcile.claims`."""

from ipam_provider.reconcile.claims import REASON_REQUESTED_ADDRESS_IGNORED as REASON_REQUESTED_ADDRESS_IGNORED
from ipam_provider.reconcile.claims import ignored_message as ignored_message
