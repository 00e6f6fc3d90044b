# Shortens a doctest report for the learner (./workbook check): the first `max` failures of
# each check and a count of the rest, nothing from checks that passed (their MESSAGE lines),
# one line per function not written yet (attn::NotImplemented, "not written yet: F in FILE")
# with the number of checks waiting for it instead of their failures, a sanitizer's report
# without its shadow-memory map, paths relative to the course root. Usage:
#   awk -v max=3 -v root=/path/to/course -f check_report.awk doctest-output
function strip(line) {
    if (root != "") gsub(root "/", "", line)
    # A build whose compiler saw relative paths (ccache's base_dir) writes ../checks/...
    while (match(line, /\.\.\/(exercises|checks|solutions|common)\//))
        line = substr(line, 1, RSTART - 1) substr(line, RSTART + 3)
    return line
}
# A stack frame of the sanitizer's report, shortened to the course's own files (the frames in
# the standard library and xtensor are counted, not shown); other lines unchanged.
function frame(line,    n, loc, name, s) {
    if (line !~ /^ +#[0-9]+ 0x[0-9a-f]+ in /) {
        if (hidden) { s = "    (" hidden " more frames outside the course's files)\n"; hidden = 0 }
        else s = ""
        return s line "\n"
    }
    n = split(line, f, " ")
    loc = f[n]
    # The crash report's own frames (checks/support) are not the learner's business either.
    if (loc !~ /^(exercises|checks|solutions|common)\// || loc ~ /^checks\/support\//) { hidden++; return "" }
    name = line
    sub(/^ +#[0-9]+ 0x[0-9a-f]+ in /, "", name)
    if (name ~ /\(/) {
        sub(/\(.*/, "", name)         # the arguments' types and the location
        sub(/.* /, "", name)           # the return type
    } else name = f[4]
    if (name ~ /^DOCTEST_ANON_FUNC/) name = "the check"
    return "    " f[1] " " loc " in " name "\n"
}
# doctest's report is made of blocks (a rule, then the test case's name and subcases), each
# holding one or more entries (an ERROR, a MESSAGE...) with their indented details.
function new_block() {
    nblocks++
    in_header = 1
}
function new_entry(line, is_error,    what, at) {
    nentries++
    entry_block[nentries] = nblocks
    entry_test[nentries] = test
    entry_error[nentries] = is_error
    entry_waits[nentries] = ""
    in_header = 0
    if (is_error && match(line, /not written yet: [A-Za-z_][A-Za-z_0-9:]* in [^ ]*exercise[^ ]*\.cpp/)) {
        what = substr(line, RSTART + length("not written yet: "), RLENGTH - length("not written yet: "))
        at = index(what, " in ")
        entry_waits[nentries] = substr(what, 1, at - 1)   # the function not written yet
        waits_for(substr(what, 1, at - 1), substr(what, at + 4))
        return
    }
    if (is_error) errors[test]++
}
# One more check (the one running) waits for `function`, which is in `file`.
function waits_for(function_name, file) {
    if ((function_name SUBSEP test) in waiting) return
    waiting[function_name SUBSEP test] = 1
    if (!(function_name in waiting_checks)) { nfunctions++; function_order[nfunctions] = function_name }
    waiting_checks[function_name]++
    function_file[function_name] = strip(file)
}
# The stack of a check stopped at the time limit, or of an index xtensor found out of bounds
# (the debug build, checks/support/main.cpp).
/^The stack where .*:$/ { in_stack = 1; report = report $0 "\n"; next }
in_stack && /^ +#[0-9]+ 0x[0-9a-f]+ in / { report = report frame(strip($0)); next }
in_stack && /^\(end of the stack\)$/ {
    in_stack = 0
    if (hidden) report = report "    (" hidden " more frames outside the course's files)\n"
    hidden = 0
    next
}
# A sanitizer's report (the debug build): kept apart, without its shadow-memory map.
/^==[0-9]+==ERROR: / { in_report = 1 }
/: runtime error: / { report = report strip($0) "\n"; in_ubsan = 1; next }
in_ubsan && /^ +#[0-9]+ 0x[0-9a-f]+ in / { report = report frame(strip($0)); next }
{ in_ubsan = 0 }
in_report {
    if ($0 ~ /^Shadow bytes around/) in_report = 2
    if (in_report == 1) report = report frame(strip($0))
    if ($0 ~ /^==[0-9]+==ABORTING/) in_report = 0
    next
}
/^=+$/ && length($0) < 70 { next }  # the sanitizer's own rule, not doctest's
/^=+$/ { new_block(); in_block = 1; next }  # doctest's rule: a new block
/^\[doctest\] / { in_block = 0; summary = summary $0 "\n"; next }
in_block {
    line = strip($0)
    if (crashed) next                # after a crash the output is not to be trusted
    if (line ~ /^TEST CASE: /) { test = line; sub(/^TEST CASE: +/, "", test) }
    if (line ~ /^[^ ].*:[0-9]+: [A-Z][A-Z ]*: /) {
        new_entry(line, line ~ /: (ERROR|FATAL ERROR): /)
        if (line ~ /test case (CRASHED|STOPPED): /) crashed = 1
    }
    if (line ~ /^  values: CHECK\( false \)$/) next  # CHECK_CLOSE's flag: the message says more
    if (in_header) header[nblocks] = header[nblocks] line "\n"
    else entry[nentries] = entry[nentries] line "\n"
    next
}
{ other = other $0 "\n" }  # anything else a check printed outside doctest's blocks
END {
    sep = "==============================================================================="
    for (i = 1; i <= nentries; i++) if (entry_waits[i] == "") last_entry[entry_test[i]] = i
    for (i = 1; i <= nentries; i++) {
        t = entry_test[i]
        if (!(t in errors)) continue                  # passed, or waits for unwritten code only
        if (entry_waits[i] != "") continue            # counted in a "not written yet" line
        show = 1
        if (entry_error[i]) { if (++shown[t] > max) show = 0 }
        else if (shown[t] >= max) show = 0            # messages after the last failure shown
        if (show) {
            if (entry_block[i] != printed_block) {
                print sep; printf "%s", header[entry_block[i]]; printed_block = entry_block[i]
            }
            printf "%s", entry[i]
        }
        if (i == last_entry[t] && errors[t] > max) {
            printf "... and %d more failures of this check (the first %d are above)\n\n", errors[t] - max, max
        }
    }
    if (printed_block) print sep
    for (k = 1; k <= nfunctions; k++) {
        fn = function_order[k]; n = waiting_checks[fn]
        printf "not written yet: %d check%s wait%s for %s (%s)\n", n, (n > 1 ? "s" : ""),
               (n > 1 ? "" : "s"), fn, function_file[fn]
    }
    printf "%s", other
    if (hidden) report = report "    (" hidden " more frames outside the course's files)\n"
    if (report != "") printf "The sanitizer's report (build-debug):\n%s\n", report
    printf "%s", summary
}
