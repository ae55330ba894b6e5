"""The controller runtime: the API client, informers and their stores, the work queue, leader election, Events,
the HTTPS endpoints (metrics, health, admission webhook), the Prometheus plumbing, logging and the Go flag forms.

Nothing here imports the domain (`ipam_provider` outside this package) or names it: tests fail on an import that does
(tests/ipam_provider/test_import_graph.py) and on a domain word (tests/ipam_provider/runtime/test_domain_free.py).
"""
