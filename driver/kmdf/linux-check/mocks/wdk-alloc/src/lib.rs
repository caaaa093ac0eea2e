#![no_std]
use core::alloc::{GlobalAlloc, Layout};
pub struct WdkAllocator;
unsafe impl GlobalAlloc for WdkAllocator {
    unsafe fn alloc(&self, _l: Layout) -> *mut u8 { core::ptr::null_mut() }
    unsafe fn dealloc(&self, _p: *mut u8, _l: Layout) {}
}
