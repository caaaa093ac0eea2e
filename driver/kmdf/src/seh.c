/*
 * seh.c: the two kernel calls irpverbs.sys makes that report failure by
 * raising an exception, each inside __try / __except so that the exception
 * becomes an NTSTATUS before it could reach a Rust frame (Rust has no SEH:
 * an exception unwinding through Rust code would bugcheck).
 *
 * Built by build.rs with the WDK's compiler, headers and definitions (the
 * ones wdk-build gives wdk-sys for its own C) and linked into irpverbs.sys.
 * Nothing else belongs here: every decision is in Rust (src/mdl.rs).
 */
#include <ntddk.h>

/*
 * MmProbeAndLockPages(Mdl, UserMode, Operation): probes the user range the
 * MDL describes for Operation (IoReadAccess or IoWriteAccess) and locks its
 * pages. Returns STATUS_SUCCESS, or the status of the exception the probe
 * raised (STATUS_ACCESS_VIOLATION for an address the process may not use,
 * STATUS_WORKING_SET_QUOTA or STATUS_INSUFFICIENT_RESOURCES when the pages
 * cannot be locked); the pages are then not locked.
 *
 * IRQL <= APC_LEVEL, in the context of the process whose range it is.
 */
NTSTATUS IvProbeAndLockPages(PMDL Mdl, LOCK_OPERATION Operation)
{
    __try {
        MmProbeAndLockPages(Mdl, UserMode, Operation);
    } __except (EXCEPTION_EXECUTE_HANDLER) {
        return GetExceptionCode();
    }
    return STATUS_SUCCESS;
}

/*
 * MmMapLockedPagesSpecifyCache(Mdl, UserMode, CacheType, NULL, FALSE,
 * NormalPagePriority | MdlMappingNoExecute): maps the (nonpaged, locked)
 * pages the MDL describes into the current process, with CacheType
 * (MmCached for memory, MmNonCached for a device BAR's page), not
 * executable, at an address the memory manager chooses. On success stores
 * the user address in *UserAddress and returns STATUS_SUCCESS; otherwise
 * stores NULL and returns the status of the exception the call raised
 * (STATUS_INSUFFICIENT_RESOURCES if it returned NULL without one).
 *
 * IRQL <= APC_LEVEL, in the context of the process to map into.
 */
NTSTATUS IvMapLockedPagesUser(PMDL Mdl, MEMORY_CACHING_TYPE CacheType, PVOID *UserAddress)
{
    PVOID address = NULL;

    *UserAddress = NULL;
    __try {
        address = MmMapLockedPagesSpecifyCache(Mdl, UserMode, CacheType, NULL, FALSE,
                                               NormalPagePriority | MdlMappingNoExecute);
    } __except (EXCEPTION_EXECUTE_HANDLER) {
        return GetExceptionCode();
    }
    if (address == NULL) {
        return STATUS_INSUFFICIENT_RESOURCES;
    }
    *UserAddress = address;
    return STATUS_SUCCESS;
}
