"""The API client caches the encoded query strings that most requests repeat, and only those: a query naming one
claim (a label selector with its uid), a continue token or a watch's resourceVersion would only churn the cache."""

from __future__ import annotations

import urllib.parse

from ipam_provider.runtime.kube.client import _encoded_query, _query_string


def test_one_off_queries_are_encoded_without_the_cache() -> None:
    _encoded_query.cache_clear()
    for n in range(300):
        for key in ("labelSelector", "continue", "resourceVersion"):
            params = ((key, f"ipam.cluster.x-k8s.io/claim-uid=uid-{n}"), ("limit", "500"))
            assert _query_string(params) == urllib.parse.urlencode(params)
    assert _encoded_query.cache_info().currsize == 0


def test_repeated_queries_come_from_the_cache() -> None:
    _encoded_query.cache_clear()
    params = (("fieldManager", "capi-ipam-provider-py"),)
    for _ in range(10):
        assert _query_string(params) == "fieldManager=capi-ipam-provider-py"
    info = _encoded_query.cache_info()
    assert (info.currsize, info.hits) == (1, 9)
