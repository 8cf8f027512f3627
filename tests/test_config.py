"""Options reach the backend; config precedence; clear errors for bad input."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from tpu_inductor.config import Config
from tpu_inductor.errors import ConfigError, PlatformUnavailableError
from tpu_inductor.runtime import get_platform


def test_precedence_options_over_environment_over_defaults():
    assert Config.load({}, environ={}).strict is False
    assert Config.load({}, environ={"TPU_INDUCTOR_STRICT": "1"}).strict is True
    assert Config.load({"strict": False}, environ={"TPU_INDUCTOR_STRICT": "1"}).strict is False
    assert Config.load({}, environ={"TPU_INDUCTOR_CACHE_DIR": "/x"}).cache_dir == "/x"


def test_default_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert Config.load({}, environ={}).resolved_cache_dir == tmp_path / "tpu_inductor"


def test_unknown_option_lists_valid_ones():
    with pytest.raises(ConfigError, match="unknown tpu_inductor option.*'stirct'.*strict"):
        Config.load({"stirct": True})


def test_unknown_option_through_torch_compile():
    fn = torch.compile(lambda x: x.sin(), backend="tpu", options={"bogus": 1})
    with pytest.raises(Exception, match="valid options are: platform, .*strict"):
        fn(torch.randn(2))


@pytest.mark.parametrize(
    "options, environ, message",
    [
        ({"strict": "maybe"}, {}, "option 'strict' must be a boolean"),
        ({}, {"TPU_INDUCTOR_CACHE": "sometimes"}, "TPU_INDUCTOR_CACHE must be a boolean"),
        ({"platform": "gpu"}, {}, "'gpu' is not one of cpu, cuda, tpu, auto"),
    ],
)
def test_bad_values_name_the_setting(options, environ, message):
    with pytest.raises(ConfigError, match=message):
        Config.load(options, environ=environ)


@pytest.mark.parametrize("platform, hint", [("cuda", "tpu_inductor\\[cuda\\]"), ("tpu", "tpu_inductor\\[tpu\\]")])
def test_missing_platform_says_what_to_install(platform, hint):
    try:
        get_platform(platform)
    except PlatformUnavailableError as error:
        assert platform in str(error)
        with pytest.raises(PlatformUnavailableError, match=hint):
            raise error
    else:
        pytest.skip(f"{platform} is installed on this machine")


def test_platform_selected_by_environment(tmp_path):
    script = textwrap.dedent(
        """
        import torch
        try:
            torch.compile(lambda x: x.cos(), backend="tpu")(torch.randn(3))
        except Exception as error:
            print("ERROR", error)
        """
    )
    env = {"TPU_INDUCTOR_PLATFORM": "tpu", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    if "ERROR" not in out.stdout:
        pytest.skip("a TPU is present")
    assert "platform 'tpu' is not available" in out.stdout


def test_backend_registered_by_entry_point_without_import(tmp_path):
    script = textwrap.dedent(
        """
        import sys, torch
        x = torch.randn(8)
        out = torch.compile(lambda t: t.exp() + 1, backend="tpu", options={"cache": False})(x)
        torch.testing.assert_close(out, x.exp() + 1)
        print("tpu_inductor" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert out.stdout.strip().endswith("True")
