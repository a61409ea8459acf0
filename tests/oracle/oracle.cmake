# The Python oracle suite (NumPy reference forward, tokenizer parity, golden fixtures) runs
# under pytest in the venv that scripts/setup.sh creates at ${CMAKE_BINARY_DIR}/venv.
set(SPECULA_VENV_PY "${CMAKE_BINARY_DIR}/venv/bin/python")
add_test(NAME oracle_pytest
  COMMAND ${SPECULA_VENV_PY} -m pytest -q -ra -p no:cacheprovider ${CMAKE_SOURCE_DIR}/tests/oracle)
set_tests_properties(oracle_pytest PROPERTIES
  TIMEOUT 1800
  ENVIRONMENT "SPECULA_BIN=$<TARGET_FILE:specula>;SPECULA_SHARED_DIR=${SPECULA_SHARED_DIR};SPECULA_CACHE=${SPECULA_MODEL_CACHE};SPECULA_BUILD_DIR=${CMAKE_BINARY_DIR};SPECULA_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
