# Writes the git commit of the source tree as a C++ string literal, at build time:
#   cmake -DSOURCE=dir -DOUT=commit.inc -P version.cmake
# "unknown" outside a git checkout; "+changes" when the tree differs from the commit. OUT is
# rewritten only when its text changes.
set(commit "unknown")
find_program(GIT git)
if(GIT)
  execute_process(COMMAND ${GIT} -C ${SOURCE} rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE failed
                  ERROR_QUIET)
  if(NOT failed AND head)
    set(commit "${head}")
    execute_process(COMMAND ${GIT} -C ${SOURCE} status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(changes)
      set(commit "${commit}+changes")
    endif()
  endif()
endif()
file(WRITE "${OUT}.tmp" "\"${commit}\"\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
