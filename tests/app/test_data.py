"""The explorer's plain functions (``dfpo.app.data``, ``dfpo.app.cache``): what the pages show, without Streamlit."""

from __future__ import annotations

import pytest

from dfpo.app import cache, data


def test_component_overrides_are_only_what_differs_from_the_preset():
    own = data.components_of("grpo_fix")
    assert own == {"stopgrad": "ratio", "aggregation": "seq_mean_token_sum", "length_aware": False, "eps_low": 1.0, "eps_high": 0.2}
    assert data.component_overrides("grpo_fix", own) == {}
    assert data.component_overrides("grpo_fix", {**own, "eps_high": 0.28}) == {"eps_high": 0.28}


def test_toy_settings_name_the_bad_value_and_its_range_before_any_training():
    args = dict(task="family", labels_text="gspo", group_size=8, inner_steps=4, steps=10, seeds=2, mode="sampled", optimizer="sgd")
    with pytest.raises(ValueError, match=r"^the learning rate lr must be between 1e-06 and 100 on this page, got lr=1e\+06$"):
        data.toy_settings(**args, lr=1e6)
    with pytest.raises(ValueError, match=r"^the group size G must be a whole number, got group_size=2.5$"):
        data.toy_settings(**{**args, "group_size": 2.5}, lr=0.5)
    with pytest.raises(ValueError, match="unknown objective='nope'"):
        data.toy_settings(**{**args, "labels_text": "gspo, nope"}, lr=0.5)
    s = data.toy_settings(**{**args, "labels_text": " gspo , dfpo_min "}, lr=0.5)
    assert s.labels == ("gspo", "dfpo_min") and s.total_steps == 20 and s.config().objectives == ("gspo", "dfpo_min")


def test_markdown_tables_are_parsed_transposed_and_written_back():
    text = "intro\n\n| objective | a | b |\n|---|---|---|\n| gspo | 1 | 2 |\n| dfpo | 3 | 4 |\n\nafter"
    blocks = data.markdown_blocks(text)
    assert blocks == ["intro", [{"objective": "gspo", "a": "1", "b": "2"}, {"objective": "dfpo", "a": "3", "b": "4"}], "after"]
    wide = data.transpose_rows(blocks[1], "objective")
    assert wide == [{"metric": "a", "gspo": "1", "dfpo": "3"}, {"metric": "b", "gspo": "2", "dfpo": "4"}]
    assert data.markdown_table(wide) == "| metric | gspo | dfpo |\n|---|---|---|\n| a | 1 | 3 |\n| b | 2 | 4 |"
    assert data.markdown_blocks(data.markdown_table(blocks[1])) == [blocks[1]]


def test_cache_round_trip_per_code_version_and_an_unwritable_folder_is_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "c"))
    assert cache.load("thing", "k") is None
    path = cache.store("thing", {"x": [1.5, 2]}, "k")
    assert path == cache.cache_path("thing", "k") and path.parent == tmp_path / "c"
    assert cache.load("thing", "k") == {"x": [1.5, 2]} and cache.load("thing", "other key") is None
    monkeypatch.setattr(cache, "code_version", lambda: "0123456789abcdef")  # the code changed
    assert cache.load("thing", "k") is None
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cache.CACHE_ENV, str(blocker / "c"))  # a file where the folder should be
    assert cache.store("thing", 1) is None and cache.load("thing") is None


def test_cache_folder_default_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "dfpo" / "app"


# ----------------------------------------------------------------------------- the atlas, one group at a time


def _atlas_by_group(objectives, groups: int, seed: int):
    return [
        c
        for name in objectives
        for c in data.atlas_objective_cells(name, [data.atlas_group_residuals(name, seed, i) for i in range(groups)])
    ]


@pytest.mark.parametrize(("groups", "seed"), [(2, 0), (3, 7)])
def test_the_atlas_built_one_group_at_a_time_is_the_cores_atlas_float_for_float(groups, seed):
    from dfpo.core.loss import OBJECTIVES
    from dfpo.core.loss.cancellation import atlas

    assert _atlas_by_group(OBJECTIVES, groups, seed) == atlas(groups=groups, seed=seed)  # AtlasCell equality: every residual


def test_the_atlas_of_many_groups_matches_the_core_on_a_few_objectives():
    from dfpo.core.loss.cancellation import atlas

    names = ["gspo", "grpo_fix", "kl_cov", "online_ipo"]  # a batch coupling and a pairwise loss among them
    assert _atlas_by_group(names, 9, 123) == atlas(names, groups=9, seed=123)


def test_atlas_draws_for_fewer_groups_are_the_first_draws_for_more():
    from hypothesis import given, settings
    from hypothesis import strategies as hs

    # Invariant: the first k groups drawn for any count n >= k are the groups drawn for k (so a page can reuse them).
    @settings(max_examples=30, deadline=None)
    @given(seed=hs.integers(*data.SEED_RANGE), k=hs.integers(1, 16), extra=hs.integers(0, 8))
    def check(seed, k, extra):
        assert data.atlas_draws(k + extra, seed)[:k] == data.atlas_draws(k, seed)

    check()
