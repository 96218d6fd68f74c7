// SPDX-License-Identifier: MIT
// The CLI's reading of what the traced processes recorded (the images'
// record files and the counts file) and its warnings about specs that did
// not attach: the bare specs' report and a bpftrace program's run share it.
#pragma once

#include <string>

#include "record.hpp"

namespace uptrace {

/// The report from the images' record files (DIR/*.rec) and the counts file:
/// one process record per process (an image, or a fork child of one), with
/// the counts of its blocks. Reads what is there now (processes may still be
/// running after a second Ctrl-C). Dies (removing `dir`) when the counts
/// file cannot be mapped.
Report read_report(const std::string& dir, int counts_fd);

/// On standard error: each spec attached in no process ("WARNING: SPEC
/// attached in no process", then up to three processes' reasons), the
/// reasons of specs attached in some processes only, and the notes about a
/// process (bpftrace's attach errors, which it prints before running; here
/// attaching happens in the traced processes).
void warn_unattached(const Report& rep);

}  // namespace uptrace
