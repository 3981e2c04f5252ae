// Status is header-only; this file keeps the base library non-empty.
#include "base/status.h"
