//! PostgreSQL fenced and check-and-set writes for leasehold (work in progress).
