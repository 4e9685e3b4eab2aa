"""Edge cases of the launch join and step assignment, on small synthetic exports (real layout, invented rows)."""
from __future__ import annotations

from profattr.attribute.budget import compute_budget
from synth import Builder, gpid, gtid


def test_launch_api_with_an_unforeseen_name_still_joins(tmp_path):
    """Launch calls are first picked by API name; a call named otherwise is found by its correlationId."""
    b = Builder(tmp_path / "c.sqlite")
    T, P = gtid(5), gpid(5)
    for i in range(3):
        t = i * 1000
        b.nvtx(T, t, t + 500, "decode_step")
        c1 = b.launch(T, t + 10, t + 20)  # cudaLaunchKernel_v7000
        b.kernel(P, c1, t + 100, t + 150, "rmsnorm_kernel")
        c2 = b.launch(T, t + 30, t + 40, name="cudaSomethingNew_v13000")
        b.kernel(P, c2, t + 200, t + 230, "rmsnorm_kernel")
    d = compute_budget(b.close()).devices[0]
    assert d["steps"] == 3 and d["kernels_per_step"] == 2.0
    assert d["outside_steps"]["ops"] == 0


def test_same_correlation_id_in_two_processes(tmp_path):
    """correlationIds repeat across processes: the join keys on (process, correlationId)."""
    b = Builder(tmp_path / "c.sqlite")
    for pid, device, dur in ((7, 0, 10), (8, 1, 40)):
        T, P = gtid(pid), gpid(pid)
        for i in range(2):
            t = i * 1000
            b.nvtx(T, t, t + 500, "decode_step")
            c = b.launch(T, t + 10, t + 20, corr=100 + i)  # the same ids in both processes
            b.kernel(P, c, t + 100, t + 100 + dur, "rmsnorm_kernel", device=device)
    budget = compute_budget(b.close())
    per_device = {d["device"]: d for d in budget.devices}
    assert per_device[0]["step_ms"] * 1e6 == 10 and per_device[1]["step_ms"] * 1e6 == 40
    assert per_device[0]["steps"] == per_device[1]["steps"] == 2


def test_launch_before_the_window_is_outside_every_step(tmp_path):
    b = Builder(tmp_path / "c.sqlite")
    T, P = gtid(5), gpid(5)
    b.kernel(P, 999, 50, 60, "rmsnorm_kernel")  # its launch call was not recorded
    for i in range(2):
        t = 100 + i * 1000
        b.nvtx(T, t, t + 500, "decode_step")
        c = b.launch(T, t + 10, t + 20)
        b.kernel(P, c, t + 100, t + 150, "rmsnorm_kernel")
    d = compute_budget(b.close()).devices[0]
    assert d["outside_steps"]["ops"] == 1 and d["kernels_per_step"] == 1.0


def test_nvtx_domain_names_join_on_domain_and_process():
    """A range's domain name is looked up by (domain id, process bits of its thread): id 0 or NULL is the default
    domain, an id named only in another process is unnamed, and the ranges keep their order."""
    import pandas as pd

    from profattr.trace.nsys_tables import with_domains

    p1, p2 = 1 << 24, 2 << 24
    frame = pd.DataFrame({"start": [0, 1, 2, 3, 4], "end": [5, 6, 7, 8, 9],
                          "tid": [p1 + 7, p2 + 9, p1 + 7, p2 + 9, p1 + 8],
                          "text": ["a", "b", "c", "d", "e"], "domain_id": [3, 3, None, 0, 4]})
    domains = {(3, p1): "sglang", (4, p2): "other"}
    got = with_domains(frame, domains)
    assert got["domain"].tolist() == ["sglang", "", "", "", ""]
    assert got["text"].tolist() == ["a", "b", "c", "d", "e"] and "domain_id" not in got
    assert with_domains(frame.copy(), {})["domain"].tolist() == [""] * 5
