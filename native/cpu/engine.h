/* placeholder replaced below */
// ---- FM_CDEF begin
// ---- FM_CDEF end
