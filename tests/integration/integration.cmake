# The integration suite: a real `specula serve` on a loopback port with the default model, driven
# by the WebSocket protocol, the `openai` client, /metrics and headless Chromium (Playwright with
# Debian's chromium). Runs under pytest in the venv that scripts/setup.sh --tests creates at
# ${CMAKE_BINARY_DIR}/venv; the chat page's screenshot is left at ${CMAKE_BINARY_DIR}/chat_page.png.
set(SPECULA_VENV_PY "${CMAKE_BINARY_DIR}/venv/bin/python")
add_test(NAME integration_pytest
  COMMAND ${SPECULA_VENV_PY} -m pytest -q -ra -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR})
set_tests_properties(integration_pytest PROPERTIES
  TIMEOUT 900
  ENVIRONMENT "SPECULA_BIN=$<TARGET_FILE:specula>;SPECULA_LOAD_BIN=$<TARGET_FILE:specula-load>;SPECULA_SHARED_DIR=${SPECULA_SHARED_DIR};SPECULA_CACHE=${SPECULA_MODEL_CACHE};SPECULA_BUILD_DIR=${CMAKE_BINARY_DIR};SPECULA_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
