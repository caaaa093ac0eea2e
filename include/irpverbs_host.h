/*
 * irpverbs_host.h - the Win32 subset irpverbs' host library provides on
 * non-Windows hosts, so that a ULP written for Windows (CreateFile,
 * DeviceIoControl with OVERLAPPED, I/O completion ports, CancelIoEx, events
 * and WaitForSingleObject) builds
 * and runs unchanged against the driver running in-process over a soft HCA.
 *
 * On Windows this header only includes <windows.h>. Elsewhere, link with
 * libirpverbs_host_c (cargo builds it as a cdylib from ulp/host-c).
 * Opening "\\\\.\\irpverbs0" loads the driver in the process.
 * Environment: IRPVERBS_ENGINE=thread runs the soft HCA's firmware on its own
 * thread; IRPVERBS_VERIFIER=0 turns the verifier off.
 */
#ifndef IRPVERBS_HOST_H
#define IRPVERBS_HOST_H

#ifdef _WIN32
#include <windows.h>
#include <winternl.h> /* NTSTATUS */
#else

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void *HANDLE;
typedef int32_t BOOL;
typedef uint32_t DWORD;
typedef DWORD *LPDWORD;
typedef uintptr_t ULONG_PTR;
typedef ULONG_PTR *PULONG_PTR;
typedef void *LPVOID;
typedef const char *LPCSTR;
typedef int32_t NTSTATUS;

typedef struct _OVERLAPPED {
    ULONG_PTR Internal;     /* NTSTATUS; STATUS_PENDING while in flight */
    ULONG_PTR InternalHigh; /* bytes transferred */
    DWORD Offset;
    DWORD OffsetHigh;
    HANDLE hEvent; /* low bit set: do not queue to the completion port */
} OVERLAPPED, *LPOVERLAPPED;

typedef struct _SECURITY_ATTRIBUTES {
    DWORD nLength;
    LPVOID lpSecurityDescriptor;
    BOOL bInheritHandle;
} SECURITY_ATTRIBUTES, *LPSECURITY_ATTRIBUTES;

#define TRUE 1
#define FALSE 0
#define INVALID_HANDLE_VALUE ((HANDLE)(intptr_t)-1)
#define INFINITE 0xFFFFFFFFu
#define GENERIC_READ 0x80000000u
#define GENERIC_WRITE 0x40000000u
#define FILE_SHARE_READ 0x00000001u
#define FILE_SHARE_WRITE 0x00000002u
#define OPEN_EXISTING 3u
#define FILE_ATTRIBUTE_NORMAL 0x00000080u
#define FILE_FLAG_OVERLAPPED 0x40000000u

#define ERROR_SUCCESS 0u
#define ERROR_INVALID_FUNCTION 1u
#define ERROR_FILE_NOT_FOUND 2u
#define ERROR_ACCESS_DENIED 5u
#define ERROR_NOT_ENOUGH_MEMORY 8u
#define ERROR_INVALID_HANDLE 6u
#define ERROR_BAD_COMMAND 22u
#define ERROR_BAD_LENGTH 24u
#define ERROR_NOT_SUPPORTED 50u
#define ERROR_DEV_NOT_EXIST 55u
#define ERROR_INVALID_PARAMETER 87u
#define ERROR_INSUFFICIENT_BUFFER 122u
#define ERROR_BUSY 170u
#define WAIT_TIMEOUT 258u
#define ERROR_ABANDONED_WAIT_0 735u
#define ERROR_OPERATION_ABORTED 995u
#define ERROR_IO_INCOMPLETE 996u
#define ERROR_IO_PENDING 997u
#define ERROR_NOACCESS 998u
#define ERROR_IO_DEVICE 1117u
#define ERROR_NOT_FOUND 1168u
#define ERROR_NO_SYSTEM_RESOURCES 1450u

#define WAIT_OBJECT_0 0u
#define WAIT_FAILED ((DWORD)0xFFFFFFFF)

#define HasOverlappedIoCompleted(lpOverlapped) \
    (((DWORD)(lpOverlapped)->Internal) != 0x00000103u)

HANDLE CreateFileA(LPCSTR lpFileName, DWORD dwDesiredAccess, DWORD dwShareMode,
                   LPVOID lpSecurityAttributes, DWORD dwCreationDisposition,
                   DWORD dwFlagsAndAttributes, HANDLE hTemplateFile);
BOOL DeviceIoControl(HANDLE hDevice, DWORD dwIoControlCode, LPVOID lpInBuffer,
                     DWORD nInBufferSize, LPVOID lpOutBuffer, DWORD nOutBufferSize,
                     LPDWORD lpBytesReturned, LPOVERLAPPED lpOverlapped);
BOOL GetOverlappedResult(HANDLE hFile, LPOVERLAPPED lpOverlapped,
                         LPDWORD lpNumberOfBytesTransferred, BOOL bWait);
HANDLE CreateIoCompletionPort(HANDLE FileHandle, HANDLE ExistingCompletionPort,
                              ULONG_PTR CompletionKey, DWORD NumberOfConcurrentThreads);
BOOL GetQueuedCompletionStatus(HANDLE CompletionPort, LPDWORD lpNumberOfBytesTransferred,
                               PULONG_PTR lpCompletionKey, LPOVERLAPPED *lpOverlapped,
                               DWORD dwMilliseconds);
BOOL PostQueuedCompletionStatus(HANDLE CompletionPort, DWORD dwNumberOfBytesTransferred,
                                ULONG_PTR dwCompletionKey, LPOVERLAPPED lpOverlapped);
BOOL CancelIoEx(HANDLE hFile, LPOVERLAPPED lpOverlapped);
/* Events: manual or auto reset; no names (lpName must be NULL, else
 * ERROR_NOT_SUPPORTED) and no security attributes. An overlapped
 * DeviceIoControl resets its hEvent when issued and sets it at completion
 * (whether or not the low bit keeps the completion off the port); the two
 * low bits of a handle are ignored, as Windows ignores them.
 * WaitForSingleObject waits on events only: WAIT_OBJECT_0, WAIT_TIMEOUT, or
 * WAIT_FAILED with ERROR_INVALID_HANDLE. */
HANDLE CreateEventA(LPSECURITY_ATTRIBUTES lpEventAttributes, BOOL bManualReset,
                    BOOL bInitialState, LPCSTR lpName);
BOOL SetEvent(HANDLE hEvent);
BOOL ResetEvent(HANDLE hEvent);
DWORD WaitForSingleObject(HANDLE hHandle, DWORD dwMilliseconds);
BOOL CloseHandle(HANDLE hObject);
DWORD GetLastError(void);
void SetLastError(DWORD dwErrCode);

/* Host only: waits up to dwMilliseconds until the driver holds nothing (no
 * file, object, command or pool allocation). TRUE, or FALSE with ERROR_BUSY. */
BOOL IrpverbsHostQuiesce(DWORD dwMilliseconds);

/* Host only: the driver unloads as at the device's removal, with the
 * verifier's unload checks and the leak check of the driver's heap. Close
 * every handle first. TRUE when nothing leaked; FALSE with ERROR_BUSY while
 * handles are open (nothing unloads), ERROR_DEV_NOT_EXIST without a device,
 * ERROR_IO_DEVICE when the verifier found something (printed on stderr).
 * The device is gone after it.
 *
 * IRPVERBS_FAIL_NTH_ALLOC=N (environment) refuses the Nth allocation the
 * process makes once the device is loaded by the first CreateFileA (0:
 * none, count only); the refusal and its site are printed on stderr when
 * made, and IrpverbsHostUnload prints the count. */
BOOL IrpverbsHostUnload(void);

/* Host only: what a kernel ULP gets from the I/O manager, for C tests of
 * kernel-mode ULP code (include/irpverbs_kernel.h).
 *
 * IrpverbsHostCreateKernelFile stands in for the file object of
 * IoGetDeviceObjectPointer: DeviceIoControl on the handle sends internal
 * device control requests from kernel mode (IRP_MJ_INTERNAL_DEVICE_CONTROL,
 * RequestorMode KernelMode). dwFlagsAndAttributes may hold
 * FILE_FLAG_OVERLAPPED. Close it with CloseHandle.
 *
 * IrpverbsHostQueryInterface stands in for IRP_MN_QUERY_INTERFACE sent to
 * the device hDevice is open on: for GUID_IV_KERNEL_INTERFACE it fills
 * *Interface with the referenced direct-call table (STATUS_SUCCESS);
 * STATUS_NOT_SUPPORTED for another interface type, STATUS_INVALID_PARAMETER
 * for a Size or Version it cannot serve (Version 1 or 2, with Size at least
 * that version's table: see irpverbs_kernel.h), STATUS_INSUFFICIENT_RESOURCES
 * when the table's context cannot be allocated (nothing is referenced).
 *
 * IrpverbsHostGetFileObject stands in for the FILE_OBJECT that
 * IoGetDeviceObjectPointer returns: what the table's CEP functions take as
 * file_object for a kernel file (NULL for a handle that is not one).
 *
 * IrpverbsHostGetCurrentIrql stands in for KeGetCurrentIrql: the calling
 * thread's IRQL as the host platform tracks it (0 PASSIVE_LEVEL, 1
 * APC_LEVEL, 2 DISPATCH_LEVEL). */
struct IvGuid;
struct IvKernelInterface;
HANDLE IrpverbsHostCreateKernelFile(DWORD dwFlagsAndAttributes);
NTSTATUS IrpverbsHostQueryInterface(HANDLE hDevice, const struct IvGuid *InterfaceType,
                                    uint16_t Size, uint16_t Version,
                                    struct IvKernelInterface *Interface);
void *IrpverbsHostGetFileObject(HANDLE hFile);
uint8_t IrpverbsHostGetCurrentIrql(void);

#ifdef __cplusplus
}
#endif

#endif /* _WIN32 */
#endif /* IRPVERBS_HOST_H */
