#include "src/observe/status_page.h"

namespace atl {

// Self-contained: no script or style from elsewhere (runs behind firewalls, offline). It polls
// /api/status every two seconds and draws with inline SVG. The page is status_page.html, embedded
// at build time (embed.cmake).
const char* StatusPageHtml() {
  return
#include "observe/status_page_html.inc"
      ;
}

}  // namespace atl
