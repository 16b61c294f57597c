"""Load test on loopback across a hot swap (helpers.serve.loadtest): 32 clients at once, a new adapter
deployed halfway, no failed request, and the p50/p95 latency reported."""

from helpers.serve.loadtest import run_load_test


def test_32_clients_across_an_adapter_swap_no_request_fails(tmp_path):
    report = run_load_test(tmp_path / "store.db", clients=32, seconds=20)
    print("load test:", report)
    assert report["requests"] >= 32 and report["failed"] == 0, report
    assert report["versions_before_swap"][0] == 0, report
    assert report["new_version"] in report["versions_after_swap"], report  # the swap happened under load
    assert report["p95_s"] >= report["p50_s"] > 0
