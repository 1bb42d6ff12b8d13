// The coordinator's status page (GET /): one self-contained HTML document that draws the run from
// GET /api/status (ServiceMonitor::StatusJson).
#ifndef ATOLL_SRC_OBSERVE_STATUS_PAGE_H_
#define ATOLL_SRC_OBSERVE_STATUS_PAGE_H_

namespace atl {

const char* StatusPageHtml();

}  // namespace atl

#endif  // ATOLL_SRC_OBSERVE_STATUS_PAGE_H_
