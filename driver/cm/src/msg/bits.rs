//! Accessors for the packed bit fields of the CM messages.
//!
//! IBTA numbers bits from the most significant one; the macros below take
//! the field's shift from the least significant bit of its word (a field at
//! IBTA bit offset `o` of width `w` in a byte has shift `8 - o - w`, in a
//! 32-bit word `32 - o - w`). Getters mask, setters drop the bits beyond
//! the field's width and keep the word's other fields.

/// A getter and a setter for a field of a big-endian 32-bit word.
macro_rules! field32 {
    ($(#[$doc:meta])* $get:ident, $set:ident: $word:ident[$shift:literal; $width:literal]) => {
        $(#[$doc])*
        #[must_use]
        pub fn $get(&self) -> u32 {
            (self.$word.get() >> $shift) & ((1u32 << $width) - 1)
        }

        #[doc = concat!("Sets [`Self::", stringify!($get), "`]; bits beyond the field's width are dropped.")]
        pub fn $set(&mut self, v: u32) {
            let m = ((1u32 << $width) - 1) << $shift;
            self.$word.set((self.$word.get() & !m) | ((v << $shift) & m));
        }
    };
}

/// A getter and a setter for a field of a byte.
macro_rules! field8 {
    ($(#[$doc:meta])* $get:ident, $set:ident: $byte:ident[$shift:literal; $width:literal]) => {
        $(#[$doc])*
        #[must_use]
        pub fn $get(&self) -> u8 {
            (self.$byte >> $shift) & ((1u8 << $width) - 1)
        }

        #[doc = concat!("Sets [`Self::", stringify!($get), "`]; bits beyond the field's width are dropped.")]
        pub fn $set(&mut self, v: u8) {
            let m = ((1u8 << $width) - 1) << $shift;
            self.$byte = (self.$byte & !m) | ((v << $shift) & m);
        }
    };
}

/// A getter and a setter for a one-bit flag of a byte.
macro_rules! flag8 {
    ($(#[$doc:meta])* $get:ident, $set:ident: $byte:ident[$shift:literal]) => {
        $(#[$doc])*
        #[must_use]
        pub fn $get(&self) -> bool {
            self.$byte & (1u8 << $shift) != 0
        }

        #[doc = concat!("Sets [`Self::", stringify!($get), "`].")]
        pub fn $set(&mut self, v: bool) {
            self.$byte = (self.$byte & !(1u8 << $shift)) | (u8::from(v) << $shift);
        }
    };
}

/// A getter and a setter for a one-bit flag of a big-endian 32-bit word.
macro_rules! flag32 {
    ($(#[$doc:meta])* $get:ident, $set:ident: $word:ident[$shift:literal]) => {
        $(#[$doc])*
        #[must_use]
        pub fn $get(&self) -> bool {
            self.$word.get() & (1u32 << $shift) != 0
        }

        #[doc = concat!("Sets [`Self::", stringify!($get), "`].")]
        pub fn $set(&mut self, v: bool) {
            self.$word
                .set((self.$word.get() & !(1u32 << $shift)) | (u32::from(v) << $shift));
        }
    };
}

pub(crate) use {field8, field32, flag8, flag32};
