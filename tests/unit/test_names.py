"""A worker listed by a host name that does not resolve (UnresolvedHost):
the fault, the network it needs, the workers' lookups and the rule, without
TensorFlow or a process."""
import pytest

from harness.core import tfconfig
from harness.diagnosis import diagnose
from harness.diagnosis.observations import Event
from harness.errors import FaultError, SettingError
from harness.faults import Partition, UnresolvedHost
from harness.plan import needs_host_names, validate
from harness.network import choose_network
from harness.worker import names
from tests import observations as o

RESOLVE_ERROR = ("Graph execution error:\n\nCollective ops is aborted by: errors resolving "
                 "mwms-worker-{w}:{port}: [field:hostname lookup error:Address lookup failed for "
                 "mwms-worker-{w}:{port} os_error: Name or service not known syscall: getaddrinfo]")
ARES_ERROR = "failed to connect to all addresses; DNS resolution failed for mwms-worker-{w}:{port}"
# TensorFlow 2.15's gRPC, measured.
JSON_ERROR = ('Collective ops is aborted by: DNS resolution failed\n:{{"created":"@1796141472.2",'
              '"description":"Failed to pick subchannel","referenced_errors":[{{"description":'
              '"DNS resolution failed","grpc_status":14,"referenced_errors":[{{"description":'
              '"Name or service not known","errno":-2,"os_error":"Name or service not known",'
              '"syscall":"getaddrinfo","target_address":"mwms-worker-{w}:{port}"}}]}}]}}')


def named(i, n, w):
    """Worker ``i``'s TF_CONFIG with worker ``w`` listed by its host name."""
    return tfconfig.name_worker([o.config(i, n)], w, tfconfig.host_name(w))[0]


def test_the_fault_lists_the_worker_by_name_in_every_config_and_says_when_it_resolves():
    configs = UnresolvedHost(1, 3).edit_configs(tfconfig.cluster_configs([7, 8, 9]), 0)
    assert all(c["cluster"]["worker"] == ["127.0.0.1:7", "mwms-worker-1:8", "127.0.0.1:9"]
               for c in configs)
    assert UnresolvedHost(1, 3).host_names() == (("mwms-worker-1", 3),)
    assert UnresolvedHost(0).host_names() == (("mwms-worker-0", None),)
    assert needs_host_names([UnresolvedHost(0)]) and not needs_host_names([Partition(0, 1)])
    assert repr(UnresolvedHost(1, 3)) == "UnresolvedHost(worker=1, seconds=3)"
    for bad, what in ((UnresolvedHost(1, -1), "seconds"), (UnresolvedHost(1, "x"), "seconds"),
                      (UnresolvedHost(2), "worker 2")):
        with pytest.raises(FaultError, match=what):
            validate([bad], 2)


def test_the_fault_needs_a_namespace_of_its_own_and_says_why_not():
    choice = choose_network("auto", "the nodes' own network", [])
    assert choice.kind == "host"
    for mode, no_ns, plan, why in (
            ("host", None, [UnresolvedHost(1)], "--mwms-network=host"),
            ("auto", "the nodes' own network", [UnresolvedHost(1)], "the nodes' own network"),
            ("auto", None, [UnresolvedHost(1), Partition(0, 1)], "network faults")):
        with pytest.raises(SettingError, match="UnresolvedHost") as e:
            choose_network(mode, no_ns, plan)
        assert why in str(e.value)


def test_a_worker_looks_up_the_names_of_its_cluster_not_its_addresses():
    config = {"cluster": {"worker": ["127.0.0.1:1", "mwms-worker-1:2", "[::1]:3",
                                     "mwms-worker-1:2"], "chief": ["chief-0:4"]},
              "task": {"type": "worker", "index": 0}}
    assert names.named_addresses(config) == ["mwms-worker-1:2", "chief-0:4"]
    assert names.named_addresses(o.config(0, 2)) == []
    assert names.named_addresses(None) == [] and names.named_addresses({"x": 1}) == []
    assert names.watch(o.config(0, 2), lambda *a, **k: None) is None


def test_a_name_is_reported_once_unresolved_then_once_resolved(monkeypatch):
    monkeypatch.setattr(names, "RETRY_EVERY", 0.001)
    answers = iter(["Name or service not known"] * 3 + [None])
    sent = []
    thread = names.watch({"cluster": {"worker": ["127.0.0.1:1", "late:2", "now:3"]}},
                         lambda kind, data: sent.append((kind, data)),
                         lookup=lambda host: next(answers) if host == "late" else None)
    thread.join(5)
    assert not thread.is_alive()
    assert sent == [("name_unresolved", {"address": "late:2", "error": "Name or service not known"}),
                    ("name_resolved", {"address": "late:2"})]


def lookups(address, resolved_at=None):
    out = (Event(0.11, "name_unresolved", data={"address": address,
                                                "error": "Name or service not known"}),)
    return out + ((Event(resolved_at, "name_resolved", data={"address": address}),)
                  if resolved_at is not None else ())


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("template", [RESOLVE_ERROR, ARES_ERROR, JSON_ERROR])
def test_the_worker_whose_address_did_not_resolve_is_named_not_those_that_failed(n, template):
    bad = n - 1
    port = o.ports(n)[bad]
    workers = [o.raised(i, n, "UnavailableError", template.format(w=bad, port=port), 1.0 + i,
                        steps=[0], tf_config=named(i, n, bad)) for i in range(n - 1)]
    workers.append(o.blocked(bad, n, steps=[0], tf_config=named(bad, n, bad)))
    v = diagnose(o.run(*workers, ended_by="grace_expired"))
    assert (v.outcome, v.culprits, v.rule, v.ambiguous) == ("failed", (bad,), "unresolved_address",
                                                            False)
    assert f"worker {bad}'s address mwms-worker-{bad}:{port} did not resolve" in v.text
    if template != ARES_ERROR:   # c-ares's words do not say why
        assert "(Name or service not known)" in v.text


def test_a_name_that_resolved_too_late_says_so():
    n, port = 2, o.ports(2)[1]
    v = diagnose(o.run(
        o.raised(0, 2, "UnavailableError", RESOLVE_ERROR.format(w=1, port=port), 1.0, steps=[0],
                 tf_config=named(0, 2, 1)),
        o.blocked(1, 2, steps=[0], tf_config=named(1, 2, 1),
                  events=o.events([0], 2) + lookups(f"mwms-worker-1:{port}", 5.2)),
        ended_by="grace_expired"))
    assert v.culprits == (1,) and "it resolved 5.2 s into the run, too late" in v.text


def test_a_chief_whose_name_never_resolved_is_named_from_the_workers_lookups():
    n, leader = 3, f"mwms-worker-0:{o.ports(3)[0]}"

    def waiting(i, resolved_at=None):
        return o.blocked(i, n, stack=o.STACK_CREATE, tf_config=named(i, n, 0),
                         events=o.events(creating_only=True) + lookups(leader, resolved_at))

    v = diagnose(o.run(*(waiting(i) for i in range(n)), ended_by="hang"))
    assert (v.outcome, v.culprits, v.rule) == ("hang", (0,), "unresolved_address")
    assert "every worker waited in strategy creation" in v.text
    # a name that came good does not explain a hang
    v = diagnose(o.run(*(waiting(i, resolved_at=2.0) for i in range(n)), ended_by="hang"))
    assert v.rule != "unresolved_address"


def test_an_address_outside_the_cluster_names_no_one():
    v = diagnose(o.run(
        o.raised(0, 2, "UnavailableError", RESOLVE_ERROR.format(w=7, port=1), 1.0, steps=[0]),
        o.blocked(1, 2, steps=[0]), ended_by="grace_expired"))
    assert v.rule != "unresolved_address"


def test_two_workers_whose_addresses_did_not_resolve_are_both_named():
    n, ports = 3, o.ports(3)
    config = lambda i: tfconfig.name_worker([named(i, n, 1)], 2, tfconfig.host_name(2))[0]
    v = diagnose(o.run(
        o.raised(0, n, "UnavailableError", RESOLVE_ERROR.format(w=1, port=ports[1]) + "\n"
                 + RESOLVE_ERROR.format(w=2, port=ports[2]), 1.0, steps=[0], tf_config=config(0)),
        o.blocked(1, n, steps=[0], tf_config=config(1)),
        o.blocked(2, n, steps=[0], tf_config=config(2)), ended_by="grace_expired"))
    assert (v.culprits, v.ambiguous, v.rule) == ((1, 2), False, "unresolved_address")
    assert (f"worker 1's address mwms-worker-1:{ports[1]}; worker 2's address "
            f"mwms-worker-2:{ports[2]} did not resolve") in v.text
