//! `nvmlErrorString`: a description for every code NVML defines (the wording is the
//! stand-in's; NVML's own strings are not in its header).

use std::ffi::CStr;

/// (code, description), sorted by code.
const TABLE: &[(u32, &CStr)] = &[
    (0, c"Success"),
    (1, c"Uninitialized"),
    (2, c"Invalid Argument"),
    (3, c"Not Supported"),
    (4, c"Insufficient Permissions"),
    (5, c"Already Initialized"),
    (6, c"Not Found"),
    (7, c"Insufficient Size"),
    (8, c"Insufficient External Power"),
    (9, c"Driver Not Loaded"),
    (10, c"Timeout"),
    (11, c"Interrupt Request Issue"),
    (12, c"NVML Shared Library Not Found"),
    (13, c"Function Not Found"),
    (14, c"Corrupted infoROM"),
    (15, c"GPU is lost"),
    (16, c"GPU requires restart"),
    (17, c"The operating system has blocked the request"),
    (18, c"RM has detected an NVML/RM version mismatch"),
    (19, c"In use by another client"),
    (20, c"Insufficient Memory"),
    (21, c"No data"),
    (999, c"Unknown Error"),
];

/// The description of `code`; "Unknown Error" for a code NVML does not define, as NVML does.
pub fn describe(code: u32) -> &'static CStr {
    TABLE.iter().find(|e| e.0 == code).map_or(c"Unknown Error", |e| e.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_words_and_the_table_is_sorted() {
        assert!(TABLE.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(describe(2).to_str().unwrap(), "Invalid Argument");
        assert_eq!(describe(12345).to_str().unwrap(), "Unknown Error");
    }
}
