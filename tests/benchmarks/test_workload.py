import hashlib
import statistics

import pytest

from benchmarks.workload import (
    LIBRITTS_TEST_CLEAN, TextOrder, frames_for_text, load_texts, plan_run, poisson_arrivals,
)


def test_libritts_copy_is_the_shared_file():
    digest = hashlib.sha256(LIBRITTS_TEST_CLEAN.read_bytes()).hexdigest()
    assert digest == "04fb4f601b36ee3380c03409655a822efb794bbb1cb43c95d6453d8912788ba5"
    texts = load_texts()
    assert len(texts) == 4837
    assert statistics.mean(len(t.split()) for t in texts) == pytest.approx(18.67, abs=0.01)


def test_plain_text_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("one two\n\n  three  \n")
    assert load_texts(path) == ["one two", "three"]
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError):
        load_texts(tmp_path / "empty.txt")


def test_frames_from_word_count():
    assert frames_for_text("a " * 10) == 52
    assert frames_for_text("a") == 5
    assert frames_for_text("") == 1


def test_poisson_arrivals_are_seeded_and_have_the_rate():
    a = poisson_arrivals(20, 100, seed=1)
    assert a == poisson_arrivals(20, 100, seed=1) and a != poisson_arrivals(20, 100, seed=2)
    assert all(0 <= x < 100 for x in a) and a == sorted(a)
    assert len(a) == pytest.approx(2000, rel=0.1)
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert statistics.mean(gaps) == pytest.approx(0.05, rel=0.1)
    assert statistics.stdev(gaps) == pytest.approx(0.05, rel=0.15)  # exponential: sd == mean


def test_each_seed_draws_its_own_text_order_and_covers_every_text():
    texts = [f"text {i}" for i in range(50)]
    a = [TextOrder(texts, 0).next() for _ in range(1)]
    order0, order1 = TextOrder(texts, 0), TextOrder(texts, 1)
    first0 = [order0.next() for _ in range(50)]
    first1 = [order1.next() for _ in range(50)]
    assert sorted(first0) == sorted(texts) and first0 != first1 and a[0] == first0[0]


def test_plan_run_fixed_length():
    order = TextOrder(["a b c", "d e"], 0)
    planned = plan_run(5, 4, 3, order, fixed_length=True)
    assert planned and all(p.num_frames == round(len(p.text.split()) * 5.2) for p in planned)
    assert len({p.seed for p in planned}) == len(planned)
    assert all(p.num_frames is None for p in plan_run(5, 4, 3, order, fixed_length=False))


def test_short_utterances_keep_only_texts_of_at_most_n_words(tmp_path):
    short = load_texts(max_words=12)
    assert short and all(len(t.split()) <= 12 for t in short)
    assert set(short) == {t for t in load_texts() if len(t.split()) <= 12}
    (tmp_path / "t.txt").write_text("one two three\nfour\n")
    assert load_texts(tmp_path / "t.txt", max_words=1) == ["four"]
    with pytest.raises(ValueError, match="at most 0 words|max_words"):
        load_texts(tmp_path / "t.txt", max_words=0)
