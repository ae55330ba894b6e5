"""Tests of the WAPI simulator itself, through the real infoblox-client and raw HTTP calls."""
