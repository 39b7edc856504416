"""PublicPolicy: when public mode is on, what it reads from the environment, and each check it makes.
The Hub cannot be reached here, so the model-size check runs on a mock of the Hub's metadata call."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from backend.public_policy import GB, Forbidden, PublicPolicy, exposure, exposure_notice

PUBLIC = PublicPolicy.from_env(True, {"PLAYGROUND_ADMIN_TOKEN": "owner-token"})
PATH_WORDS = "Hugging Face Hub only"


@pytest.mark.parametrize(
    ("public", "environ", "is_public"),
    [
        (False, {}, False),
        (True, {}, True),
        (False, {"SPACE_ID": "someone/playground"}, True),
        (False, {"PLAYGROUND_PUBLIC": "1"}, True),
        (False, {"PLAYGROUND_PUBLIC": "0"}, False),
    ],
)
def test_public_mode_is_on_with_the_flag_or_a_spaces_variables(public, environ, is_public):
    assert PublicPolicy.from_env(public, environ).is_public is is_public


def test_limits_and_urls_come_from_the_environment():
    env = {
        "PLAYGROUND_MAX_TOKENS": "64",
        "PLAYGROUND_MAX_MODEL_GB": "0.5",
        "PLAYGROUND_ALLOWED_URLS": "https://a.example/v1, *",
    }
    policy = PublicPolicy.from_env(True, env)
    assert (policy.max_tokens, policy.max_model_bytes, policy.allowed_urls) == (
        64,
        GB // 2,
        ("https://a.example/v1", "*"),
    )
    assert policy.max_bench_requests == 64 and "admin" not in repr(policy)  # the token never prints
    for name, bad in (("PLAYGROUND_MAX_TOKENS", "-1"), ("PLAYGROUND_MAX_BENCH_REQUESTS", "2.5")):
        with pytest.raises(ValueError, match=name):
            PublicPolicy.from_env(True, {name: bad})


def test_engine_control_needs_the_admin_token_in_public_mode_only():
    PublicPolicy().check_admin(None)  # local mode: anyone
    PUBLIC.check_admin("owner-token")
    for token in (None, "", "owner-toke", "owner-token "):
        with pytest.raises(Forbidden, match="admin token"):
            PUBLIC.check_admin(token)
    with pytest.raises(Forbidden, match="PLAYGROUND_ADMIN_TOKEN"):
        PublicPolicy(is_public=True).check_admin("anything")  # no token set: nobody controls the engine


def test_trust_remote_code_is_refused_in_public_mode():
    PublicPolicy().check_trust_remote_code(True)
    with pytest.raises(Forbidden, match="trust_remote_code"):
        PUBLIC.check_trust_remote_code(True)


@pytest.mark.parametrize(
    "model",
    ["/etc", "/no/such/dir", "../secrets", "~/model", "tests/data", "model.gguf", "a/b/c", "C:\\x", "x..y/z"],
)
def test_paths_are_refused_with_the_same_words_whether_they_exist_or_not(model):
    with pytest.raises(Forbidden) as refused:
        PUBLIC.check_model_name(model)
    assert PATH_WORDS in str(refused.value) and "not found" not in str(refused.value)


def test_hub_ids_and_the_owners_own_model_pass():
    PUBLIC.check_model_name("HuggingFaceTB/SmolLM2-135M-Instruct")
    PUBLIC.check_model_name("gpt2")
    PUBLIC.check_model_name("/srv/owner/model.gguf", presets=("/srv/owner/model.gguf",))
    PublicPolicy().check_model_name("/etc")  # local mode: anything


def hub_metadata_mock(files: dict[str, int | None]):
    """Stands in for huggingface_hub.model_info(repo, files_metadata=True)."""
    calls = []

    def model_info(repo_id, files_metadata, timeout):
        calls.append((repo_id, files_metadata))
        siblings = [SimpleNamespace(rfilename=name, size=size) for name, size in files.items()]
        return SimpleNamespace(siblings=siblings)

    return model_info, calls


def test_model_size_is_checked_from_mocked_hub_metadata_before_download():
    files = {
        "model-00001-of-00002.safetensors": 2 * GB,
        "model-00002-of-00002.safetensors": 1 * GB,
        "config.json": 700,
        "tokenizer.json": 2_000_000,
        "pytorch_model.bin": 6 * GB,  # not downloaded by the loader: not counted
        "original/consolidated.pth": 9 * GB,
    }
    model_info, calls = hub_metadata_mock(files)
    with pytest.raises(Forbidden, match=r"downloads 3\.00 GB; .* up to 3 GB"):
        PUBLIC.check_model_size("big/model", model_info)
    assert calls == [("big/model", True)]
    small = {k: v for k, v in files.items() if not k.startswith("model-00002")}
    assert PUBLIC.check_model_size("ok/model", hub_metadata_mock(small)[0]) == 2 * GB + 2_000_700


def test_model_size_check_fails_closed_on_the_mocked_hub():
    with pytest.raises(ValueError, match=r"did not report the size of model\.safetensors"):
        PUBLIC.check_model_size("x/y", hub_metadata_mock({"model.safetensors": None})[0])

    def unreachable(*args, **kwargs):
        raise OSError("no route to host")

    with pytest.raises(ValueError, match="cannot read x/y's file sizes from the Hub"):
        PUBLIC.check_model_size("x/y", unreachable)


def test_limits_apply_in_public_mode_only():
    assert PublicPolicy().limit(10_000, "max_bench_requests", "number of requests") == 10_000
    pattern = r"number of requests must be at most 64 .*PLAYGROUND_MAX_BENCH_REQUESTS.*got 65"
    with pytest.raises(Forbidden, match=pattern):
        PUBLIC.limit(65, "max_bench_requests", "number of requests")


@pytest.mark.parametrize(
    ("host", "share", "exposed"),
    [
        ("127.0.0.1", False, False),
        ("127.0.0.2", False, False),
        ("::1", False, False),
        ("localhost", False, False),
        ("0.0.0.0", False, True),
        ("::", False, True),
        ("192.168.1.20", False, True),
        ("myhost.example", False, True),
        ("127.0.0.1", True, True),
    ],
)
def test_exposure_turns_public_mode_on_unless_the_owner_says_unsafe_local(host, share, exposed):
    by = exposure(host, share)
    assert (by is not None) is exposed
    policy = PublicPolicy.from_env(False, {}, exposed_by=by)
    assert policy.is_public is exposed
    notice = exposure_notice(by, policy)
    assert (notice is not None and "public mode is on" in notice) is exposed
    local = PublicPolicy.from_env(False, {}, exposed_by=by, unsafe_local=True)
    assert not local.is_public
    warning = exposure_notice(by, local)
    assert (warning is not None and warning.startswith("* WARNING")) is exposed
    assert PublicPolicy.from_env(True, {}, exposed_by=by, unsafe_local=True).is_public  # --public wins


def test_the_new_limits_come_from_the_environment():
    env = {
        "PLAYGROUND_MAX_CLIENT_WAITING": "4",
        "PLAYGROUND_MAX_UPLOADS": "2",
        "PLAYGROUND_FORWARDED_HOPS": "1",
    }
    policy = PublicPolicy.from_env(True, env)
    assert (policy.max_client_waiting, policy.max_uploads, policy.forwarded_hops) == (4, 2, 1)
    assert policy.max_upload_bytes == 1024 * 1024
