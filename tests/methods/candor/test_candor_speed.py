"""Issue 57 (CANDOR at the floor): the stage asks no neighbour question twice and its bootstrap's pool threads
each run torch on one thread, with every table unchanged."""
import threading

import numpy as np
import pandas as pd
import torch

from robustbench_fm.methods.candor import bootstrap, influence
from robustbench_fm.methods.candor import stage as candor


def _cohort(n_groups=2, size=900, prevalence=0.5, dim=16, seed=3):
    rng = np.random.default_rng(seed)
    n, n_pos = n_groups * size, int(prevalence * size)
    labels = np.concatenate([rng.permutation(np.r_[np.ones(n_pos), np.zeros(size - n_pos)]) for _ in range(n_groups)])
    man = pd.DataFrame({"sample_id": [f"s{i:05d}" for i in range(n)],
                        "patient_id": [f"p{i // 2:05d}" for i in range(n)],
                        "acq_group": np.repeat([f"g{g}" for g in range(n_groups)], size), "finding": labels})
    feats = rng.standard_normal((n, dim)).astype(np.float32)
    feats[:, 0] += 0.5 * labels
    return man, feats


def _spy(monkeypatch, module, log, name="topk_similarity"):
    real = getattr(module, name)

    def search(feats, queries, cands, k, *a, **kw):
        log.append((np.asarray(queries).tobytes(), np.asarray(cands).tobytes(), k))
        return real(feats, queries, cands, k, *a, **kw)

    monkeypatch.setattr(module, name, search, raising=False)


def test_the_exact_path_searches_each_question_once_and_the_tables_stay(monkeypatch):
    """One finding over large groups takes the exact path: D_all's searches of the queries among all positives /
    negatives are taken k + e wide and the influence reads them (influence.Searches); before, it searched the
    same queries × candidates again. Every table equals the run that searches anew."""
    man, feats = _cohort()
    params = dict(k=5, bank_size=150, max_group_sample=400, n_boot=30, neighbour_path="exact")
    monkeypatch.setattr(candor, "Searches", lambda: None, raising=False)  # every request searched anew
    alone = candor.run(feats, man, "finding", **params)
    monkeypatch.undo()
    log = []
    _spy(monkeypatch, candor, log)
    _spy(monkeypatch, influence, log)
    _spy(monkeypatch, influence, log, "plain_topks")
    shared = candor.run(feats, man, "finding", **params)
    pairs = [(q, c) for q, c, _ in log]
    assert len(pairs) == 2 * 6 and len(set(pairs)) == len(pairs)  # per group: 2 margin, 2 D_all, 2 influence banks
    # D_all's searches take k = 5 and, from the same products, 5 + 1 (itself) + 2 (a patient's images)
    assert sorted({str(k) for _, _, k in log}) == ["(5, 8)", "5", "8"]
    for table in ("summary", "per_sample", "items", "neighbours"):
        pd.testing.assert_frame_equal(getattr(shared, table), getattr(alone, table), check_exact=True)


def test_searches_keep_the_wider_search_of_the_same_products():
    """A request for the k nearest with ``wider`` keeps the k + e nearest from the same tiles: each equals the
    search for it alone (values and candidates); a narrower request is never cut from a wider one."""
    x = torch.as_tensor(np.random.default_rng(1).standard_normal((300, 8)).astype(np.float32))
    x = x / x.norm(dim=1, keepdim=True)
    queries, cands = np.arange(0, 40), np.arange(20, 300)
    searches = influence.Searches()
    for k, wider in ((5, 9), (9, 0), (7, 0)):
        got, direct = searches.topk(x, queries, cands, k, 4096, "torch", None, wider), \
            influence.topk_similarity(x, queries, cands, k)
        assert torch.equal(got[0], direct[0]) and torch.equal(got[1], direct[1])
    assert sorted(k for *_, k in searches._found) == [9]  # 9 kept beside 5; 7 searched anew


def test_the_influence_of_d_and_d_all_share_a_bank_that_holds_every_positive(monkeypatch):
    """Every positive of a group in its bank (prevalence below half): D's and D_all's influence ask the same
    positive candidates, answered once (the bank_influence memo)."""
    man, feats = _cohort(size=600, prevalence=0.2)
    asked = []
    real = influence.without_each

    def spy(feats, queries, cands, *a, **kw):
        asked.append((np.asarray(queries).tobytes(), np.asarray(cands).tobytes()))
        return real(feats, queries, cands, *a, **kw)

    monkeypatch.setattr(influence, "without_each", spy)
    candor.run(feats, man, "finding", k=5, bank_size=4000, max_group_sample=600, n_boot=0)
    assert len(asked) == 2 * 3 and len(set(asked)) == len(asked)  # per group: the bank, R−, all negatives


def test_the_bootstraps_pool_threads_run_torch_on_one_thread(monkeypatch):
    """The pooled rows' resamples run on a pool of Python threads; torch inside them on one thread each (a
    cumsum of 6,000 × 64 took 17 ms with 2 intra-op threads per pool thread, 2.5 ms with one)."""
    man, feats = _cohort(n_groups=3, size=300)
    seen = []
    real = bootstrap._evaluate_chunk

    def spy(*a):
        seen.append((threading.current_thread() is threading.main_thread(), torch.get_num_threads()))
        return real(*a)

    monkeypatch.setattr(bootstrap, "_evaluate_chunk", spy)
    torch.set_num_threads(2)  # the module's fixture restores the threads
    candor.run(feats, man, "finding", k=5, bank_size=100, max_group_sample=300, n_boot=40)
    in_pool = [threads for main, threads in seen if not main]
    assert in_pool and set(in_pool) == {1}
    assert torch.get_num_threads() == 2
