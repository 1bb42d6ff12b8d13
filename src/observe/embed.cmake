# Embeds a text file as a C++ raw string literal, at build time:
#   cmake -DIN=page.html -DOUT=page_html.inc -P embed.cmake
# OUT is rewritten only when its text changes (no rebuild of what includes it otherwise).
file(READ "${IN}" content)
string(FIND "${content}" ")atoll_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} holds the raw string's delimiter )atoll_embed\"")
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${IN} at build time: edit that file.\nR\"atoll_embed(${content})atoll_embed\"\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
