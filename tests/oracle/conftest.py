"""Shared fixtures for the oracle suite: paths to the built program, the cache and shared data."""
import os
import pathlib

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("SPECULA_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("SPECULA_BUILD_DIR", SOURCE_DIR / "build"))
SHARED_DIR = pathlib.Path(os.environ.get("SPECULA_SHARED_DIR", SOURCE_DIR.parent / "shared"))
CACHE_DIR = pathlib.Path(os.environ.get("SPECULA_CACHE", pathlib.Path.home() / ".cache" / "specula"))
SPECULA_BIN = pathlib.Path(os.environ.get("SPECULA_BIN", BUILD_DIR / "specula"))
FIXTURE_DIR = SOURCE_DIR / "tests" / "fixtures"
DEFAULT_MODEL = CACHE_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def specula_bin():
    assert SPECULA_BIN.exists(), f"build the specula program first: {SPECULA_BIN} is missing"
    return SPECULA_BIN


@pytest.fixture(scope="session")
def default_model():
    assert DEFAULT_MODEL.exists(), f"run scripts/setup.sh to fetch the default model into {DEFAULT_MODEL}"
    return DEFAULT_MODEL


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("oracle")
