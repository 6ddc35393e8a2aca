"""Fair share of verify rows across clients: the pure allotment by hand, the ledger, the scheduler."""

from __future__ import annotations

import argparse
import json
import threading

import pytest
from helpers import GREEDY

from cloud.engine import ForwardItem
from cloud.fair_share import CAP_AFTER_DRAFTS, WEIGHT_FLOOR, ClientLedger, allot_verifies, fair_shares
from cloud.metrics import CLIENT_BUCKETS, ServiceMetrics, client_bucket
from cloud.scheduler import Scheduler
from edge.schedule import SpecConfig


def _rows(items, chosen):
    out: dict[str, int] = {}
    for i in chosen:
        client, rows = items[i]
        out[client] = out.get(client, 0) + rows
    return out


def test_two_clients_one_flooding_each_get_half():
    items = [("flood", 8)] * 6 + [("honest", 4)] * 4  # the flood is older
    chosen = allot_verifies(items, 16)
    assert chosen[0] == 0  # the oldest always goes
    assert _rows(items, chosen) == {"flood": 8, "honest": 8}


def test_a_client_needing_less_leaves_its_rows_to_the_other():
    items = [("flood", 4)] * 8 + [("honest", 2)]
    assert fair_shares({"flood": 32, "honest": 2}, 16) == {"flood": 14.0, "honest": 2.0}
    assert _rows(items, allot_verifies(items, 16)) == {"flood": 12, "honest": 2}  # 4-row items: 12 of 14 fit
    alone = [("flood", 4)] * 8
    assert _rows(alone, allot_verifies(alone, 16)) == {"flood": 16}  # nobody else waits: all rows


def test_the_oldest_goes_even_past_its_share_and_items_are_never_split():
    items = [("flood", 12), ("honest", 4), ("honest", 4), ("flood", 2)]
    chosen = allot_verifies(items, 16)
    assert chosen == [0, 1]  # honest's second would exceed max_rows; the flood's 2 rows too
    assert allot_verifies([("a", 40)], 16) == [0]


def test_shares_are_weighted_by_acceptance():
    assert fair_shares({"good": 100, "bad": 100}, 24, {"good": 1.0, "bad": 0.2}) == {"good": 20.0, "bad": 4.0}
    items = [("bad", 2)] * 10 + [("good", 2)] * 10
    assert _rows(items, allot_verifies(items, 24, {"good": 1.0, "bad": 0.2})) == {"bad": 4, "good": 20}
    ledger = ClientLedger()
    assert ledger.weight("new") == 1.0 and not ledger.capped("new")
    for _ in range(50):
        ledger.record("good", rows=9, committed=8, drafted=8, accepted=7)
        ledger.record("good", rows=1, committed=1)  # a stale decode: no drafts
        ledger.record("bad", rows=17, committed=1, drafted=16, accepted=0)
    assert abs(ledger.weight("good") - 9 / 10) < 0.02  # by rows: the one-row step counts a tenth
    assert ledger.weight("bad") == WEIGHT_FLOOR and ledger.capped("bad") and not ledger.capped("good")
    ledger.record("once", rows=100, committed=0, drafted=CAP_AFTER_DRAFTS - 1, accepted=0)
    assert ledger.weight("once") == WEIGHT_FLOOR and not ledger.capped("once")  # too few drafts to call it a trend
    for _ in range(200):  # capped, it drafts 2 a block: its rows commit a third of a token each, its drafts nothing
        ledger.record("bad", rows=3, committed=1, drafted=2, accepted=0)
    assert ledger.weight("bad") > WEIGHT_FLOOR and ledger.capped("bad")
    for _ in range(200):  # a weak but honest drafter: a quarter of its drafts accepted, never capped
        ledger.record("weak", rows=5, committed=2, drafted=4, accepted=1)
        ledger.record("cloud-only", rows=1, committed=1)
    assert not ledger.capped("weak") and not ledger.capped("cloud-only") and ledger.weight("cloud-only") == 1.0


def test_client_labels_fall_into_bounded_buckets():
    labels = {client_bucket(f"token-{i}") for i in range(1000)}
    assert len(labels) == CLIENT_BUCKETS and client_bucket("x") == client_bucket("x")
    metrics = ServiceMetrics()
    metrics.observe_client("x", rows=17, committed=1, capped=True)
    label = {"client": client_bucket("x")}
    assert metrics.registry.get_sample_value("splitspec_client_rows_total", label) == 17
    assert metrics.registry.get_sample_value("splitspec_client_capped_steps_total", label) == 1


class _Recording:
    """The tiny engine, recording each forward's rows by client (the seq's owner in ``clients``)."""

    def __init__(self, engine, clients):
        self.engine, self.clients, self.forwards = engine, clients, []

    def forward_batch(self, items):
        rows: dict[str, int] = {}
        for item in items:
            rows[self.clients[id(item.seq)]] = rows.get(self.clients[id(item.seq)], 0) + item.rows
        self.forwards.append(rows)
        return self.engine.forward_batch(items)


def test_a_flooding_client_gets_no_more_than_its_share_of_rows(tiny_engine):
    clients: dict[int, str] = {}
    engine = _Recording(tiny_engine, clients)
    scheduler = Scheduler(engine, max_rows=16, min_prefill_rows=4)

    def verify(client, rows):
        seq = tiny_engine.new_sequence()
        clients[id(seq)] = client
        return lambda: (yield ForwardItem(seq, [1] + [5] * (rows - 1)))

    try:
        gate_open, holding = threading.Event(), threading.Event()
        scheduler.submit(lambda: (holding.set(), gate_open.wait(10)))
        holding.wait(10)
        futures = [scheduler.submit(verify("flood", 8), client="flood") for _ in range(6)]
        futures += [scheduler.submit(verify("honest", 4), client="honest") for _ in range(4)]
        gate_open.set()
        for future in futures:
            future.result(30)
    finally:
        scheduler.shutdown()
    both = [f for f in engine.forwards if "honest" in f]
    assert both and all(f.get("flood", 0) <= 8 for f in both)
    assert engine.forwards[0] == {"flood": 8, "honest": 8}
    assert scheduler.stats.contended_rows["flood"] <= scheduler.stats.contended_owed["flood"]


def test_the_fairness_bench_reports_its_keys_and_attackers_get_no_more_than_their_share(capsys):
    from sim.commands.bench import add_bench_commands

    parser = argparse.ArgumentParser()
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["fairness", "--honest", "2", "--attackers", "2", "--max-new-tokens", "24"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("honest_tok_s_alone", "honest_tok_s_with_attackers", "attacker_row_share", "fair_row_share"):
        assert report[key] >= 0
    assert report["identical"] and report["contended_rows"] > 0
    assert report["attackers_capped"] == 2 and report["honest_capped"] == 0
    assert report["attacker_row_share"] <= report["fair_row_share"] + 0.05
    assert report["oldest_first"]["honest_tok_s_with_attackers"] > 0 and 0 < report["equal_row_share"] < 1
    assert report["honest_refused"] == [] and report["max_forward_rows"] <= report["max_batch_rows"]
    assert 0 <= report["independent_fair_row_share"] <= 1 and report["tracebacks"] == []


def test_the_bench_computes_max_min_shares_itself():
    from sim.bench.fairness import independent_share, max_min_shares

    assert max_min_shares({"a": 2, "b": 10, "c": 10}, 12) == {"a": 2.0, "b": 5.0, "c": 5.0}
    assert max_min_shares({"a": 2, "b": 3}, 100) == {"a": 2.0, "b": 3.0}  # room for all: each its demand
    log = [({"honest": 4, "attacker": 60}, {"honest": 4, "attacker": 60})]
    assert independent_share(log, 12, lambda c: c == "attacker") == pytest.approx(8 / 12)
    assert independent_share(log, 256, lambda c: c == "attacker") == pytest.approx(60 / 64)


@pytest.mark.slow
def test_the_fairness_bench_runs_every_strategy_and_reports_what_it_cost(capsys):
    """Every attacker strategy at once (small): the report says what the honest edges met; the figures
    are the bench's to judge (docs/results), here only that they are measured."""
    from sim.commands.bench import add_bench_commands

    parser = argparse.ArgumentParser()
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["fairness", "--honest", "2", "--attackers", "1", "--max-new-tokens", "16",
                              "--strategies", "all", "--streams", "2"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["strategies"] == ["garbage", "salami", "slow_reader", "keep_alive", "flood", "made_up"]
    assert report["identical"] and report["honest_refused"] == [] and report["honest_tok_s_with_attackers"] > 0
    assert report["rss_growth_mb"] >= 0 and report["max_forward_rows"] <= report["max_batch_rows"]


def test_the_fairness_bench_names_the_strategies_it_knows():
    from sim.bench.fairness import FairnessBench

    with pytest.raises(ValueError, match="strategies must be among garbage, salami"):
        FairnessBench(strategies=("garbage", "sneaky")).checked()


def test_a_lowered_draft_limit_holds_only_blocks_of_later_epochs(tiny_engine, greedy_path):
    from helpers import new_session

    from cloud.session import BlockRejected

    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt)
    assert session.penalise(2) and session.draft_limit.current == 2 and not session.policy.decode_stale
    assert not session.penalise(3) and session.draft_limit.lowered == 2  # a limit only comes down
    start = len(prompt)
    verdict = session.verify(0, start, want[:4])  # drafted before the edge could know: the old limit holds
    assert verdict.accepted == 4 and session.epoch == 0
    wrong = (want[5] + 1) % tiny_engine.vocab_size
    verdict = session.verify(0, start + 5, [want[5], wrong])  # a correction: epoch 1
    assert verdict.is_correction and session.epoch == 1
    with pytest.raises(BlockRejected, match="exceeds the limit of 2"):
        session.verify(1, start + 7, want[7:10])
    assert session.verify(1, start + 7, want[7:9]).accepted == 2


@pytest.mark.parametrize("takes_ahead", [False, True])
def test_an_open_session_of_a_client_that_commits_nothing_is_held_to_short_blocks(tiny_engine, greedy_path,
                                                                                   takes_ahead):
    """Mid-session the client's rows fall to the weight floor: its verdicts carry the capped draft limit,
    the edge keeps to it from then on, and the output is still the target's own. An edge that takes tokens
    decoded ahead (``cloud.decode_ahead``) may instead find its garbage blocks stale, unverified: then they
    cost no rows, and its verified rows stay at about one a committed token, as cloud-only's."""
    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from sim.bench.attackers import GarbageDrafter

    prompt, want = greedy_path

    class Counting(GarbageDrafter):
        asked: list[int] = []

        def propose_block(self, n):
            self.asked.append(n)
            return super().propose_block(n)

    class Edge(GrpcVerifier):
        def _open_message(self, *args, **fields):
            message = super()._open_message(*args, **fields)
            message.takes_ahead = takes_ahead
            return message

    limits = ServiceLimits(max_draft_len=16, capped_draft_len=2)
    with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=limits)) as server:
        verifier = Edge(VerifierEndpoint(server.address, tiny_engine.vocab_size, tiny_engine.fingerprint))
        verifier.connect()
        drafter = Counting(tiny_engine.vocab_size, seed=1)
        drafter.asked = []
        result = run_decode(drafter, verifier, prompt, GREEDY, max_new_tokens=40, spec=SpecConfig(8, window=1))
        ledger = server.server.servicer.scheduler.ledger
        capped = [ledger.capped(client) for client in ledger.clients]
        (stats,) = ledger.clients.values()
    assert result.tokens == want
    if takes_ahead and capped == [False]:
        assert result.stats.ahead > 0 and stats.rows <= 2 * stats.committed, (stats.rows, stats.committed)
        return
    assert capped == [True] and sum(drafter.asked) >= CAP_AFTER_DRAFTS
    assert drafter.asked[0] == 8 and drafter.asked[-1] <= 2 and max(drafter.asked[-10:]) <= 2


def test_the_ledger_forgets_the_client_recorded_longest_ago():
    ledger = ClientLedger(max_clients=2)
    ledger.record("a", rows=200, committed=0, drafted=199)
    ledger.record("b", rows=4, committed=4)
    ledger.record("a", rows=4, committed=0)  # a is the most recent now
    ledger.record("c", rows=4, committed=4)
    assert list(ledger.clients) == ["a", "c"] and ledger.capped("a") and ledger.weight("b") == 1.0


def test_acceptance_is_read_over_every_draft_row_a_forward_fed(tiny_engine, greedy_path):
    """A salami chain (a first block with a few right drafts, long wrong blocks behind it in the same
    forward) counts every draft it fed: the blocks past the correction cost rows and are drafts that
    failed, not drafts that were never verified."""
    from helpers import new_session

    from cloud.engine import run_alone
    from cloud.session import PendingBlock

    prompt, want = greedy_path
    p = len(prompt)
    wrong = [(t + 1) % tiny_engine.vocab_size for t in want]
    session = new_session(tiny_engine, prompt)
    pending = [PendingBlock(0, p, want[:2] + wrong[2:8], more_follows=True)] + [
        PendingBlock(0, p + 8 * k, wrong[8 * k : 8 * k + 8], more_follows=True) for k in (1, 2, 3)]
    step = run_alone(session.verify_chain_steps(pending), tiny_engine)
    assert [v.accepted for v in step.verdicts] == [2]  # verification stopped at the first correction
    assert (step.drafts, step.drafts_accepted) == (32, 2)  # every fed draft counts (the first block alone: 8)
    ledger = ClientLedger()
    for _ in range(CAP_AFTER_DRAFTS // 32 + 1):
        ledger.record("salami", rows=step.client_rows, committed=step.client_tokens, drafted=step.drafts,
                      accepted=step.drafts_accepted)
    assert ledger.capped("salami")  # 2 / 32, 6%: under the floor (the first block's 2 / 8 is 25%: never capped)


def test_a_lowered_draft_limit_survives_a_new_turn(tiny_engine, greedy_path):
    """A new turn (``Open.extend``) asks for its draft length again; a penalty stays (from the turn's
    first block), so a capped client cannot shake it off by starting another turn."""
    from helpers import new_session

    from cloud.engine import run_alone

    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt)
    assert session.penalise(2) and session.draft_limit.for_epoch(session.epoch + 1) == 2
    run_alone(session.extend_steps(len(prompt), want[:3], GREEDY, max_new_tokens=8, max_draft_len=16), tiny_engine)
    assert session.epoch == 0 and session.draft_limit.for_epoch(0) == 2 and session.draft_limit.opened == 16
    fresh = new_session(tiny_engine, prompt)  # the control: no penalty, the turn's own limit
    run_alone(fresh.extend_steps(len(prompt), want[:3], GREEDY, max_new_tokens=8, max_draft_len=16), tiny_engine)
    assert fresh.draft_limit.for_epoch(0) == 16
