//! WDF object contexts (what `WDF_DECLARE_CONTEXT_TYPE` declares in C) and
//! small helpers for WDF's versioned structures.

use core::ffi::CStr;

use wdk_sys::{
    _WDF_EXECUTION_LEVEL, _WDF_SYNCHRONIZATION_SCOPE, PCWDF_OBJECT_CONTEXT_TYPE_INFO, ULONG,
    WDF_OBJECT_ATTRIBUTES, WDF_OBJECT_CONTEXT_TYPE_INFO, WDFOBJECT,
    call_unsafe_wdf_function_binding,
};

/// `sizeof(T)` as the `ULONG` that WDF's versioned structures carry in
/// their `Size` field (`WDF_STRUCTURE_SIZE`).
pub(crate) const fn struct_size<T>() -> ULONG {
    const { assert!(size_of::<T>() <= ULONG::MAX as usize) };
    #[allow(clippy::cast_possible_truncation, reason = "asserted above")]
    let size = size_of::<T>() as ULONG;
    size
}

/// `WDF_OBJECT_ATTRIBUTES_INIT`: no context, inherited execution level and
/// synchronization scope.
pub(crate) fn object_attributes() -> WDF_OBJECT_ATTRIBUTES {
    WDF_OBJECT_ATTRIBUTES {
        Size: struct_size::<WDF_OBJECT_ATTRIBUTES>(),
        ExecutionLevel: _WDF_EXECUTION_LEVEL::WdfExecutionLevelInheritFromParent,
        SynchronizationScope: _WDF_SYNCHRONIZATION_SCOPE::WdfSynchronizationScopeInheritFromParent,
        ..WDF_OBJECT_ATTRIBUTES::default()
    }
}

/// A context type: a `WDF_OBJECT_CONTEXT_TYPE_INFO` in a static, whose
/// address identifies the type (its `UniqueType` points to itself).
///
/// Declare one with [`context_type!`]; set it on an object with
/// [`ContextType::attributes`]; read an object's context with
/// [`ContextType::get`].
#[repr(transparent)]
pub(crate) struct ContextType(WDF_OBJECT_CONTEXT_TYPE_INFO);

// SAFETY: a ContextType is built at compile time and never written after
// (neither by this crate nor by WDF, which only reads it); the pointers it
// holds are to 'static data: a C string literal and the static itself.
unsafe impl Sync for ContextType {}

impl ContextType {
    /// The type info for a context of `size` bytes named `name`, whose
    /// unique identity is `this` (the static being initialized).
    pub(crate) const fn new(
        name: &'static CStr,
        size: usize,
        this: *const WDF_OBJECT_CONTEXT_TYPE_INFO,
    ) -> Self {
        Self(WDF_OBJECT_CONTEXT_TYPE_INFO {
            Size: struct_size::<WDF_OBJECT_CONTEXT_TYPE_INFO>(),
            // WDF only reads the name; `cast_mut` fits both the `PCHAR` of
            // older WDKs and the `LPCSTR` of newer ones.
            ContextName: name.as_ptr().cast_mut(),
            ContextSize: size,
            UniqueType: this,
            EvtDriverGetUniqueContextType: None,
        })
    }

    /// The value for `WDF_OBJECT_ATTRIBUTES.ContextTypeInfo`
    /// (`WDF_GET_CONTEXT_TYPE_INFO(type)->UniqueType`).
    pub(crate) const fn info(&'static self) -> PCWDF_OBJECT_CONTEXT_TYPE_INFO {
        self.0.UniqueType
    }

    /// `WDF_OBJECT_ATTRIBUTES_INIT_CONTEXT_TYPE`: object attributes that
    /// give the object a zero-filled context of this type.
    pub(crate) fn attributes(&'static self) -> WDF_OBJECT_ATTRIBUTES {
        WDF_OBJECT_ATTRIBUTES {
            ContextTypeInfo: self.info(),
            ..object_attributes()
        }
    }

    /// The context of this type of `object` (`WdfObjectGetTypedContext`),
    /// as a raw pointer: null if the object has no such context.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Safety
    /// `object` must be a live WDF object handle. The returned memory lives
    /// as long as the object; it is the caller's to type correctly (`T` must
    /// be the type this context was declared for).
    pub(crate) unsafe fn get<T>(&'static self, object: WDFOBJECT) -> *mut T {
        // SAFETY: the caller guarantees `object` is a live handle; the type
        // info is a 'static of the right layout.
        let context = unsafe {
            call_unsafe_wdf_function_binding!(WdfObjectGetTypedContextWorker, object, self.info())
        };
        context.cast()
    }
}

/// Declares a `static $name: ContextType` for the context struct `$ty`.
///
/// The static lives in `.data`, as `WDF_DECLARE_CONTEXT_TYPE` puts it in C
/// (and as windows-drivers-rs's samples do).
macro_rules! context_type {
    ($name:ident, $ty:ty, $cname:literal) => {
        #[unsafe(link_section = ".data")]
        pub(crate) static $name: $crate::context::ContextType = $crate::context::ContextType::new(
            $cname,
            size_of::<$ty>(),
            &raw const $name as *const _,
        );
    };
}
pub(crate) use context_type;
