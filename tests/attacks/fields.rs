//! (filled in by the issue 29 work)
