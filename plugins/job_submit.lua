--[[
slurm-elastic job_submit/lua plugin: checks #ELASTIC directives at submit time and stores the normalized spec
on the job.

Install: copy to the directory of slurm.conf as job_submit.lua and set JobSubmitPlugins=lua (Slurm 22.05; Debian's
job_submit_lua.so runs it under Lua 5.1, the tests also run it under 5.3).

What it does (docs/directives.md has the details):
  * slurm_job_submit: reads the #ELASTIC lines of job_desc.script with the same grammar as the Python parser
    (slurm_elastic/directives, the source of truth; tests/vectors/directives.json keeps both in step).
      - invalid directives: the job is rejected (slurm.ERROR) and every problem is shown to the user through
        slurm.log_user, one line each: "line N: --option: why (allowed: range)";
      - valid directives: the normalized spec goes into job_desc.admin_comment as a "[elastic:v1 ...]" segment
        (replacing an earlier segment, keeping the rest of the text); a job submitted to several partitions
        (-p train,cold) also gets "[elastic-partitions:train,cold]": Slurm shows a running job only the one it
        runs in, and its extension jobs may use any of them;
      - no directives, or no script (salloc, srun): the job is left alone.
  * Heterogeneous jobs: slurmctld calls slurm_job_submit once per component, in order, and only component 0
    (the leader) carries the script. At component 0 the script is parsed and the specs per --het-group are
    kept; component N (N > 0) then gets the spec of "--het-group N" in its own admin_comment. A --het-group
    for a component that does not exist is ignored.
  * slurm_job_modify: when an administrator rewrites admin_comment without an elastic segment, the job's
    existing segment is carried over ("[elastic:off]" is the way to switch elasticity off by hand), and so is
    its partitions segment.
  * Never breaks slurmctld or submissions: everything runs under pcall; an internal error is logged and the
    job is accepted unchanged (fail open: the controller's own read of the script still applies the rules).
    Work is bounded: at most 128 #ELASTIC lines of at most 1024 bytes, 20 errors, and only the leading
    comment block is parsed (plus one plain-text search for #ELASTIC lines after it, for a warning).
Portable Lua 5.1 .. 5.4: no goto, no integer division, no "\x" escapes, no bit operators.
--]]

-- The slurm-elastic release this file belongs to: `slurm-elastic doctor` compares it with the installed package
-- (tests/unit/test_doctor_checks.py keeps it equal to pyproject.toml's version).
local SLURM_ELASTIC_VERSION = "0.1.0"

local M = {}
M.version = SLURM_ELASTIC_VERSION

M.FORMAT_TAG = "elastic:v1"
M.MAX_LINE_BYTES = 1024
M.MAX_DIRECTIVE_LINES = 128
M.MAX_ERRORS = 20
M.MAX_WARNINGS = 10
M.MAX_HET_GROUP = 127
M.MAX_NODES = 65536
M.QUOTE_MAX_BYTES = 32

local MAGIC = "#ELASTIC"
local LINE_OPTION = "#ELASTIC"
local HET_GROUP_OPTION = "--het-group"
local NO_VAL = 4294967294  -- Slurm's NO_VAL: het_job_offset of an ordinary job
local HUGE = 1000000000000  -- stands for "more than 9 digits": above every bound

-- option-table:begin (rendered by scripts/render-keys from slurm_elastic/directives/options.py; do not edit)
M.OPTIONS = {
  { option = "--min-nodes", key = "min", field = "min_nodes", kind = "int", default = 1, lo = 1, hi = 65536 },
  { option = "--max-nodes", key = "max", field = "max_nodes", kind = "int", default = nil, lo = 1, hi = 65536 },
  { option = "--step", key = "step", field = "step", kind = "int", default = 1, lo = 1, hi = 65536 },
  { option = "--scale-up-above", key = "up", field = "scale_up_above", kind = "percent",
    default = 90, lo = 1, hi = 100 },
  { option = "--scale-down-below", key = "down", field = "scale_down_below", kind = "percent",
    default = 20, lo = 0, hi = 99 },
  { option = "--window", key = "window", field = "window_s", kind = "duration", default = 600, lo = 10, hi = 86400 },
  { option = "--cooldown", key = "cooldown", field = "cooldown_s", kind = "duration",
    default = 300, lo = 0, hi = 86400 },
  { option = "--grace", key = "grace", field = "grace_s", kind = "duration", default = 120, lo = 0, hi = 3600 },
  { option = "--signal", key = "signal", field = "signal", kind = "signal", default = "USR1" },
  { option = "--het-group", key = "het", field = "het_group", kind = "int", default = nil, lo = 0, hi = 127 },
  { option = "--no-grow", key = "grow", field = "grow", kind = "flag", default = true },
  { option = "--no-shrink", key = "shrink", field = "shrink", kind = "flag", default = true },
  { option = "--serving", key = "serving", field = "serving", kind = "flag", default = false },
  { option = "--slo-p99", key = "slo", field = "slo_p99_ms", kind = "millis", default = nil, lo = 1, hi = 600000 },
  { option = "--target-rps-per-replica", key = "rps", field = "target_rps_per_replica", kind = "int",
    default = nil, lo = 1, hi = 10000000 },
  { option = "--prewarm", key = "prewarm", field = "prewarm", kind = "command", default = nil, lo = 1, hi = 256 },
  { option = "--prewarm-timeout", key = "prewarmtimeout", field = "prewarm_timeout_s", kind = "duration",
    default = 600, lo = 1, hi = 86400 },
  { option = "--whole-nodes", key = "whole", field = "whole_nodes", kind = "flag", default = false },
}
-- option-table:end

-- Signals a job may ask for, with their Linux numbers, in the order messages list them.
M.SIGNALS = {
  { "HUP", 1 }, { "INT", 2 }, { "QUIT", 3 }, { "USR1", 10 }, { "USR2", 12 }, { "ALRM", 14 }, { "TERM", 15 },
  { "CONT", 18 }, { "URG", 23 }, { "XCPU", 24 }, { "WINCH", 28 },
}
M.UNCATCHABLE_SIGNALS = { { "KILL", 9 }, { "STOP", 19 } }

local BY_OPTION, BY_FIELD, SETTINGS = {}, {}, {}
local option_names = {}
for _, o in ipairs(M.OPTIONS) do
  BY_OPTION[o.option] = o
  BY_FIELD[o.field] = o
  option_names[#option_names + 1] = o.option
  if o.option ~= HET_GROUP_OPTION then SETTINGS[#SETTINGS + 1] = o end
end
local ALL_OPTIONS_TEXT = table.concat(option_names, ", ")

local signal_names = {}
local SIGNAL_NUMBER = {}
for _, s in ipairs(M.SIGNALS) do
  signal_names[#signal_names + 1] = s[1]
  SIGNAL_NUMBER[s[1]] = s[2]
end
local UNCATCHABLE = {}
for _, s in ipairs(M.UNCATCHABLE_SIGNALS) do UNCATCHABLE[s[1]] = s[2] end
local SIGNALS_TEXT = table.concat(signal_names, ", ") .. " as NAME, SIGNAME or number"

local AFTER_COMMAND_WARNING = "ignored: #ELASTIC lines after the first command (line %s) are not read"
local NEAR_MISS_WARNING = "ignored: looks like a directive, but only lines that start with '#ELASTIC' are read"
local NOT_HET_MESSAGE = "the job is not heterogeneous"
local NEEDS_HET_GROUP_MESSAGE = "a heterogeneous job needs --het-group N on its #ELASTIC lines"

local find, sub, byte, char, format = string.find, string.sub, string.byte, string.char, string.format

-- Integers are always rendered through num(): Lua 5.3 would print 600.0 for a float.
local function num(n)
  return format("%d", n)
end

local function starts(s, prefix)
  return sub(s, 1, #prefix) == prefix
end

-- ASCII-only upper case (string.upper follows the C locale, e.g. Turkish dotted i).
local function ascii_upper(s)
  return (string.gsub(s, "[a-z]", function(c) return char(byte(c) - 32) end))
end

function M.escape(raw)
  local cut = sub(raw, 1, M.QUOTE_MAX_BYTES)
  local out = {}
  for i = 1, #cut do
    local b = byte(cut, i)
    if b == 92 then
      out[#out + 1] = "\\\\"
    elseif b >= 32 and b <= 126 then
      out[#out + 1] = char(b)
    else
      out[#out + 1] = format("\\x%02x", b)
    end
  end
  local s = table.concat(out)
  if #raw > M.QUOTE_MAX_BYTES then s = s .. "..." end
  return s
end
local escape = M.escape

local function quote(raw)
  return "'" .. escape(raw) .. "'"
end

function M.format_duration(seconds)
  if seconds == 0 then return "0s" end
  local parts = {}
  for _, u in ipairs({ { "d", 86400 }, { "h", 3600 }, { "m", 60 }, { "s", 1 } }) do
    local n = math.floor(seconds / u[2])
    seconds = seconds - n * u[2]
    if n > 0 then parts[#parts + 1] = num(n) .. u[1] end
  end
  return table.concat(parts)
end
local format_duration = M.format_duration

local function allowed_text(opt)
  if opt.kind == "int" or opt.kind == "percent" then return num(opt.lo) .. ".." .. num(opt.hi) end
  if opt.kind == "duration" then return format_duration(opt.lo) .. ".." .. format_duration(opt.hi) end
  if opt.kind == "signal" then return SIGNALS_TEXT end
  if opt.kind == "millis" then
    return num(opt.lo) .. "ms.." .. num(opt.hi) .. "ms as 50ms, 50 (milliseconds) or 2s"
  end
  if opt.kind == "command" then
    return "a command of " .. num(opt.lo) .. ".." .. num(opt.hi) .. " bytes, quoted: 'python stage.py --to /tmp'"
  end
  return nil
end

local function is_digits(s)
  return find(s, "^[0-9]+$") ~= nil
end

-- Value of a digit string, or HUGE when it has more than 9 significant digits.
local function digits_value(s)
  local significant = string.gsub(s, "^0+", "")
  if #significant > 9 then return HUGE end
  return tonumber(s)
end

local function bounded(opt, raw, value)
  if value < opt.lo or value > opt.hi then
    return nil, quote(raw) .. " is out of range", allowed_text(opt)
  end
  return value
end

local function parse_int(opt, raw)
  if not is_digits(raw) then return nil, quote(raw) .. " is not a whole number", allowed_text(opt) end
  return bounded(opt, raw, digits_value(raw))
end

local function parse_percent(opt, raw)
  local digits = raw
  if sub(raw, -1) == "%" then digits = sub(raw, 1, -2) end
  if not is_digits(digits) then return nil, quote(raw) .. " is not a whole percentage", allowed_text(opt) end
  return bounded(opt, raw, digits_value(digits))
end

local UNIT_ORDER = { d = 1, h = 2, m = 3, s = 4 }
local UNIT_SIZE = { d = 86400, h = 3600, m = 60, s = 1 }

-- Seconds in a duration, or nil when it is not one.
local function duration_seconds(raw)
  if is_digits(raw) then return digits_value(raw) end
  local days, first, second, third = string.match(raw, "^([0-9]+)%-([0-9]+):([0-9][0-9]?):([0-9][0-9]?)$")
  if not days then
    first, second, third = string.match(raw, "^([0-9]+):([0-9][0-9]?):([0-9][0-9]?)$")
  end
  if first then -- [D-]HH:MM:SS
    if tonumber(second) >= 60 or tonumber(third) >= 60 then return nil end
    if days and tonumber(first) >= 24 then return nil end
    local total = digits_value(first) * 3600 + tonumber(second) * 60 + tonumber(third)
    if days then total = total + digits_value(days) * 86400 end
    return total
  end
  first, second = string.match(raw, "^([0-9]+):([0-9][0-9]?)$")
  if first then -- MM:SS
    if tonumber(second) >= 60 then return nil end
    return digits_value(first) * 60 + tonumber(second)
  end
  local pos, last, total = 1, 0, 0
  while pos <= #raw do
    local s, e, digits, unit = find(raw, "^([0-9]+)([dhms])", pos)
    if not s or UNIT_ORDER[unit] <= last then return nil end
    last = UNIT_ORDER[unit]
    total = total + digits_value(digits) * UNIT_SIZE[unit]
    pos = e + 1
  end
  if pos == 1 then return nil end
  return total
end

local function parse_duration(opt, raw)
  local seconds = duration_seconds(raw)
  if seconds == nil then
    return nil, quote(raw) .. " is not a duration",
      format_duration(opt.lo) .. ".." .. format_duration(opt.hi) .. " as 90, 90s, 10m, 1h30m, MM:SS or HH:MM:SS"
  end
  return bounded(opt, raw, seconds)
end

-- A latency in whole milliseconds: 50ms, 50 or 2s.
local function parse_millis(opt, raw)
  local digits, scale = raw, 1
  if sub(raw, -2) == "ms" then
    digits = sub(raw, 1, -3)
  elseif sub(raw, -1) == "s" then
    digits, scale = sub(raw, 1, -2), 1000
  end
  if not is_digits(digits) then return nil, quote(raw) .. " is not a latency", allowed_text(opt) end
  return bounded(opt, raw, digits_value(digits) * scale)
end

local function parse_signal(opt, raw)
  local name
  if is_digits(raw) then
    if #raw <= 3 then
      local n = tonumber(raw)
      for _, list in ipairs({ M.SIGNALS, M.UNCATCHABLE_SIGNALS }) do
        for _, s in ipairs(list) do
          if s[2] == n then name = s[1] end
        end
      end
    end
  elseif not find(raw, "[\128-\255]") then
    name = ascii_upper(raw)
    if starts(name, "SIG") then name = sub(name, 4) end
  end
  if name and UNCATCHABLE[name] then
    return nil, "SIG" .. name .. " can not be caught, so the job could not checkpoint", SIGNALS_TEXT
  end
  if not name or not SIGNAL_NUMBER[name] then
    return nil, quote(raw) .. " is not a supported signal", SIGNALS_TEXT
  end
  return name
end

-- Words of a line or command (slurm_elastic/directives/words.py has the rules): a list of {text, quoted}, or
-- nil and the error. A quote opens only at the start of a word or right after the first "=" of a "--" word.
local function closing(data, start)
  local q = sub(data, start, start)
  local e = find(data, q, start + 1, true)
  if not e then return nil, "unterminated " .. q .. " quote" end
  local after = sub(data, e + 1, e + 1)
  if after ~= "" and after ~= " " and after ~= "\t" then return nil, "text right after a closing " .. q .. " quote" end
  return e
end

function M.split_words(data, comments)
  local out, i, n = {}, 1, #data
  while i <= n do
    local c = sub(data, i, i)
    if c == " " or c == "\t" then
      i = i + 1
    elseif c == "'" or c == '"' then
      local e, err = closing(data, i)
      if not e then return nil, err end
      out[#out + 1] = { text = sub(data, i + 1, e - 1), quoted = true }
      i = e + 1
    elseif comments and c == "#" then
      break
    else
      local j = find(data, "[ \t]", i) or (n + 1)
      local word = sub(data, i, j - 1)
      local eq = find(word, "=", 1, true)
      local q = eq and sub(data, i + eq, i + eq)
      if starts(word, "--") and eq and (q == "'" or q == '"') then
        local e, err = closing(data, i + eq)
        if not e then return nil, err end
        out[#out + 1] = { text = sub(word, 1, eq) .. sub(data, i + eq + 1, e - 1), quoted = false }
        i = e + 1
      else
        out[#out + 1] = { text = word, quoted = false }
        i = j
      end
    end
  end
  return out
end
local split_words = M.split_words

local function parse_command(opt, raw)
  if not find(raw, "[^ \t]") then return nil, "empty command", allowed_text(opt) end
  if #raw > opt.hi then
    return nil, "command is too long (" .. num(#raw) .. " bytes)", allowed_text(opt)
  end
  local words, err = split_words(raw, false)
  if not words then return nil, err .. " in the command " .. quote(raw), allowed_text(opt) end
  return raw
end

local function parse_value(opt, raw)
  if opt.kind == "command" then return parse_command(opt, raw) end
  if opt.kind == "int" then return parse_int(opt, raw) end
  if opt.kind == "percent" then return parse_percent(opt, raw) end
  if opt.kind == "duration" then return parse_duration(opt, raw) end
  if opt.kind == "millis" then return parse_millis(opt, raw) end
  return parse_signal(opt, raw)
end

-- --- parse state -----------------------------------------------------------------------------------------

local function add_error(st, line, option, message, allowed)
  if st.stopped then return end
  if #st.errors >= M.MAX_ERRORS then
    st.errors[#st.errors + 1] = { line = line, option = LINE_OPTION, message = "too many errors, stopped reading" }
    st.stopped = true
    return
  end
  st.errors[#st.errors + 1] = { line = line, option = option, message = message, allowed = allowed }
end

local function warn(st, line, message)
  if st.stopped then return end
  if #st.warnings < M.MAX_WARNINGS then
    st.warnings[#st.warnings + 1] = { line = line, message = message }
  end
end

local function is_command(line)
  local c = string.match(line, "^[ \t\r\v\f]*([^ \t\r\v\f])")
  return c ~= nil and c ~= "#"
end

local function is_near_miss(line)
  return find(line, "^[ \t]*#+[ \t]*[Ee][Ll][Aa][Ss][Tt][Ii][Cc][ \t]+%-%-[A-Za-z]") ~= nil
end

local function next_is_value(words, i)
  local w = words[i]
  return w ~= nil and (w.quoted or not starts(w.text, "--"))
end

local function directive(st, lineno, line)
  st.directive_lines = st.directive_lines + 1
  if not st.first_directive_line then st.first_directive_line = lineno end
  if st.directive_lines > M.MAX_DIRECTIVE_LINES then
    add_error(st, lineno, LINE_OPTION, "too many #ELASTIC lines", "at most " .. num(M.MAX_DIRECTIVE_LINES))
    st.stopped = true
    return
  end
  if #line > M.MAX_LINE_BYTES then
    add_error(st, lineno, LINE_OPTION, "line is too long (" .. num(#line) .. " bytes)",
      "at most " .. num(M.MAX_LINE_BYTES) .. " bytes")
    return
  end
  local rest = sub(line, #MAGIC + 1)
  local c = sub(rest, 1, 1)
  if rest ~= "" and c ~= " " and c ~= "\t" then
    add_error(st, lineno, LINE_OPTION, "must be followed by a space or a tab", nil)
    return
  end
  local words, werr = split_words(rest, true)
  if not words then
    add_error(st, lineno, LINE_OPTION, werr, nil)
    return
  end

  local items = {}
  local het_group, het_col, het_bad = nil, nil, false
  local i = 1
  while i <= #words and not st.stopped do
    local col, word, quoted = i - 1, words[i].text, words[i].quoted
    i = i + 1
    if quoted or not starts(word, "--") then
      add_error(st, lineno, LINE_OPTION, "unexpected " .. quote(word) .. ": options start with --", nil)
    else
      local name, has_eq, inline = word, false, nil
      local eq = find(word, "=", 1, true)
      if eq then name, has_eq, inline = sub(word, 1, eq - 1), true, sub(word, eq + 1) end
      local opt = BY_OPTION[name]
      if not opt then
        add_error(st, lineno, escape(name), "unknown option", ALL_OPTIONS_TEXT)
        -- An unknown option's value would only cause a second, confusing error: skip it too.
        if not has_eq and next_is_value(words, i) then i = i + 1 end
      else
        local value, ok = nil, true
        if opt.kind == "flag" then
          if has_eq then
            add_error(st, lineno, opt.option, "takes no value", nil)
            ok = false
          else
            value = not opt.default
          end
        else
          local raw = inline
          if not has_eq and next_is_value(words, i) then
            raw = words[i].text
            i = i + 1
          end
          if raw == nil or (raw == "" and opt.kind ~= "command") then
            add_error(st, lineno, opt.option, "missing value", allowed_text(opt))
            ok = false
          else
            local message, allowed
            value, message, allowed = parse_value(opt, raw)
            if value == nil then
              add_error(st, lineno, opt.option, message, allowed)
              ok = false
            end
          end
          if not ok and opt.option == HET_GROUP_OPTION then het_bad = true end
        end
        if ok then
          if opt.option == HET_GROUP_OPTION then
            if het_col ~= nil then
              add_error(st, lineno, opt.option, "set more than once (first on line " .. num(lineno) .. ")", nil)
              het_bad = true
            else
              het_group, het_col = value, col
            end
          else
            items[#items + 1] = { opt = opt, value = value, col = col }
          end
        end
      end
    end
  end
  if st.stopped or het_bad then return end
  local scope
  if het_group ~= nil then
    if not st.groups[het_group] then
      st.groups[het_group] = {}
      st.group_ids[#st.group_ids + 1] = het_group
    end
    scope = st.groups[het_group]
    if not st.first_het_group_line then st.first_het_group_line = lineno end
  else
    scope = st.jobwide
  end
  for _, it in ipairs(items) do
    local previous = scope[it.opt.field]
    if previous then
      add_error(st, lineno, it.opt.option, "set more than once (first on line " .. num(previous.line) .. ")", nil)
    else
      scope[it.opt.field] = { value = it.value, line = lineno, col = it.col }
    end
  end
end

local function read(st, data)
  local n, pos, lineno = #data, 1, 0
  local command_line
  while pos <= n do
    -- Whitespace-only lines mean nothing in the block: skip a run of them in C (4 MB of blank lines would
    -- otherwise cost about a second of Lua while slurmctld holds its job lock).
    local q = find(data, "[^ \t\r\v\f\n]", pos)
    if q == nil then break end
    if q > pos then
      local chunk = sub(data, pos, q - 1)
      local last_newline = string.match(chunk, "^.*()\n")
      if last_newline then
        local _, skipped = string.gsub(chunk, "\n", "")
        lineno = lineno + skipped
        pos = pos + last_newline
      end
    end
    local e = find(data, "\n", pos, true)
    local line
    if e then
      line = sub(data, pos, e - 1)
      pos = e + 1
    else
      line = sub(data, pos)
      pos = n + 1
    end
    lineno = lineno + 1
    if byte(line, -1) == 13 then line = sub(line, 1, -2) end
    if starts(line, MAGIC) then
      directive(st, lineno, line)
      if st.stopped then return end
    elseif is_command(line) then
      command_line = lineno
      break
    elseif is_near_miss(line) then
      warn(st, lineno, NEAR_MISS_WARNING)
    end
  end
  if not command_line then return end
  -- #ELASTIC lines after the first command: one plain search, counting lines only up to each hit.
  local search_from, cur_pos, cur_line = pos - 1, pos, command_line + 1
  while #st.warnings < M.MAX_WARNINGS do
    local hit = find(data, "\n" .. MAGIC, search_from, true)
    if not hit then break end
    local line_start = hit + 1
    while cur_pos < line_start do
      cur_pos = find(data, "\n", cur_pos, true) + 1
      cur_line = cur_line + 1
    end
    warn(st, cur_line, format(AFTER_COMMAND_WARNING, num(command_line)))
    search_from = line_start
  end
end

-- --- rules between options, and the normalized form -------------------------------------------------------

local function later(a, b)
  return a.line > b.line or (a.line == b.line and a.col > b.col)
end

local function where(s)
  if s == nil then return "the default" end
  if s.line > 0 then return "set on line " .. num(s.line) end
  return "as given"
end

local function check_rules(settings)
  local errors = {}
  local function value(field)
    local s = settings[field]
    if s then return s.value end
    return BY_FIELD[field].default
  end
  local mn, mx = settings.min_nodes, settings.max_nodes
  if mx and value("min_nodes") > value("max_nodes") then
    if later(mx, mn) then
      errors[#errors + 1] = { line = mx.line, option = "--max-nodes",
        message = num(mx.value) .. " is below --min-nodes " .. num(mn.value) .. ", " .. where(mn),
        allowed = num(mn.value) .. ".." .. num(M.MAX_NODES) }
    else
      errors[#errors + 1] = { line = mn.line, option = "--min-nodes",
        message = num(mn.value) .. " is above --max-nodes " .. num(mx.value) .. ", " .. where(mx),
        allowed = "1.." .. num(mx.value) }
    end
  end
  -- both thresholds given: they must make a band; one alone meets the site's policy (the controller checks it)
  local up_s, down_s = settings.scale_up_above, settings.scale_down_below
  if up_s and down_s and down_s.value >= up_s.value then
    local up, down = up_s.value, down_s.value
    if later(up_s, down_s) then
      errors[#errors + 1] = { line = up_s.line, option = "--scale-up-above",
        message = num(up) .. " is not above --scale-down-below " .. num(down) .. ", " .. where(down_s),
        allowed = num(down + 1) .. "..100" }
    else
      errors[#errors + 1] = { line = down_s.line, option = "--scale-down-below",
        message = num(down) .. " is not below --scale-up-above " .. num(up) .. ", " .. where(up_s),
        allowed = "0.." .. num(up - 1) }
    end
  end
  local no_grow, no_shrink = settings.grow, settings.shrink
  if no_grow and no_shrink then
    local late, early, late_opt, early_opt = no_grow, no_shrink, "--no-grow", "--no-shrink"
    if later(no_shrink, no_grow) then
      late, early, late_opt, early_opt = no_shrink, no_grow, "--no-shrink", "--no-grow"
    end
    errors[#errors + 1] = { line = late.line, option = late_opt,
      message = "with " .. early_opt .. " (" .. where(early) .. ") the job could never be resized" }
  end
  local serving = settings.serving
  local objectives = {}
  for _, o in ipairs({ { "--slo-p99", "slo_p99_ms" }, { "--target-rps-per-replica", "target_rps_per_replica" } }) do
    if settings[o[2]] then objectives[#objectives + 1] = { o[1], settings[o[2]] } end
  end
  if serving and #objectives == 0 then
    errors[#errors + 1] = { line = serving.line, option = "--serving",
      message = "needs an objective: --slo-p99 and/or --target-rps-per-replica" }
  end
  if not serving then
    for _, o in ipairs(objectives) do
      errors[#errors + 1] = { line = o[2].line, option = o[1], message = "is for serving jobs: add --serving" }
    end
  end
  local timeout = settings.prewarm_timeout_s
  if timeout and not settings.prewarm then
    errors[#errors + 1] = { line = timeout.line, option = "--prewarm-timeout", message = "needs --prewarm" }
  end
  return errors
end

local function render_value(v)
  if type(v) == "boolean" then
    if v then return "1" end
    return "0"
  end
  if type(v) == "number" then return num(v) end
  return v
end

function M.normalize(settings, het_group)
  local parts = { M.FORMAT_TAG }
  if het_group ~= nil then parts[#parts + 1] = "het=" .. num(het_group) end
  for _, opt in ipairs(SETTINGS) do
    local s = settings[opt.field]
    if s and opt.kind == "command" then
      parts[#parts + 1] = opt.key .. "=" .. string.gsub(s.value, ".", function(ch) return format("%02X", byte(ch)) end)
    elseif s then
      parts[#parts + 1] = opt.key .. "=" .. render_value(s.value)
    end
  end
  return table.concat(parts, " ")
end

local function same_error(a, b)
  return a.line == b.line and a.option == b.option and a.message == b.message and a.allowed == b.allowed
end

-- Errors in line order (stable), so that they read like a compiler's; when reading stopped, the error that
-- stopped it stays last.
local function ordered(errors, stopped)
  local n, idx, out = #errors, {}, {}
  local keep_last = stopped and n > 0
  for i = 1, n do
    if not (keep_last and i == n) then idx[#idx + 1] = i end
  end
  table.sort(idx, function(a, b)
    if errors[a].line ~= errors[b].line then return errors[a].line < errors[b].line end
    return a < b
  end)
  for _, i in ipairs(idx) do out[#out + 1] = errors[i] end
  if keep_last then out[#out + 1] = errors[n] end
  return out
end

-- Parse a script. Returns { specs = { {het = N|nil, normalized = "elastic:v1 ..."} }, errors = {...},
-- warnings = {...}, directive_lines, first_directive_line, first_het_group_line }. Never raises for any string.
function M.parse_script(script)
  local st = { errors = {}, warnings = {}, jobwide = {}, groups = {}, group_ids = {}, directive_lines = 0,
    stopped = false }
  read(st, script)
  local specs = {}
  if not st.stopped and st.directive_lines > 0 then
    local scopes = {}
    if #st.group_ids > 0 then
      table.sort(st.group_ids)
      for _, g in ipairs(st.group_ids) do
        local merged = {}
        for k, v in pairs(st.jobwide) do merged[k] = v end
        for k, v in pairs(st.groups[g]) do merged[k] = v end
        scopes[#scopes + 1] = { het = g, settings = merged }
      end
    else
      scopes[1] = { het = nil, settings = st.jobwide }
    end
    for _, scope in ipairs(scopes) do
      local rule_errors = check_rules(scope.settings)
      for _, e in ipairs(rule_errors) do
        local seen = false
        for _, old in ipairs(st.errors) do
          if same_error(old, e) then seen = true end
        end
        if not seen then add_error(st, e.line, e.option, e.message, e.allowed) end
      end
      if st.stopped then break end
      if #rule_errors == 0 then
        specs[#specs + 1] = { het = scope.het, normalized = M.normalize(scope.settings, scope.het) }
      end
    end
  end
  if #st.errors > 0 then specs = {} end
  return { specs = specs, errors = ordered(st.errors, st.stopped), warnings = st.warnings, directive_lines = st.directive_lines,
    first_directive_line = st.first_directive_line, first_het_group_line = st.first_het_group_line }
end

-- Which spec applies to an ordinary job (offset nil) or to het component `offset`; see
-- slurm_elastic/directives/parser.py select_component. Returns spec-or-nil, errors.
function M.select_component(result, offset)
  if #result.errors > 0 or #result.specs == 0 then return nil, {} end
  local grouped = result.first_het_group_line ~= nil
  if offset == nil then
    if grouped then
      return nil, { { line = result.first_het_group_line, option = HET_GROUP_OPTION, message = NOT_HET_MESSAGE } }
    end
    return result.specs[1], {}
  end
  if not grouped then
    return nil, { { line = result.first_directive_line, option = LINE_OPTION, message = NEEDS_HET_GROUP_MESSAGE } }
  end
  for _, spec in ipairs(result.specs) do
    if spec.het == offset then return spec, {} end
  end
  return nil, {}
end

-- --- admin_comment: the "[elastic:...]" segment ---------------------------------------------------------

local SEGMENT = "%[elastic:[^%[%]]*%]"  -- no brackets inside: "[elastic: [elastic:v1]" is read right
M.OFF = "elastic:off"

function M.extract(admin_comment)
  if admin_comment == nil or admin_comment == "" then return nil end
  local s = string.match(admin_comment, SEGMENT)
  if s then return sub(s, 2, -2) end
  return nil
end

-- admin_comment with the first segment matching pattern replaced by segment and any later ones removed, or with
-- segment appended when none matches.
local function put_segment(admin_comment, pattern, segment)
  if admin_comment == nil or admin_comment == "" then return segment end
  if not find(admin_comment, pattern) then return admin_comment .. " " .. segment end
  local first = true
  return (string.gsub(admin_comment, pattern, function()
    if first then
      first = false
      return segment
    end
    return ""
  end))
end

function M.embed(admin_comment, body)
  return put_segment(admin_comment, SEGMENT, "[" .. body .. "]")
end

-- The partitions an elastic job was submitted to, when several (slurm_elastic/directives/admin_comment.py reads
-- it). Only names without brackets or spaces; any earlier such segment is replaced.
local PARTITIONS_SEGMENT = "%[elastic%-partitions:[^%[%]%s]*%]"

function M.embed_partitions(admin_comment, partitions)
  if type(partitions) ~= "string" or not find(partitions, ",", 1, true) or find(partitions, "[%[%]%s]") then
    return admin_comment
  end
  return put_segment(admin_comment, PARTITIONS_SEGMENT, "[elastic-partitions:" .. partitions .. "]")
end

function M.describe(e)
  local s = e.option .. ": " .. e.message
  if e.allowed then s = s .. " (allowed: " .. e.allowed .. ")" end
  return s
end

-- --- the Slurm entry points --------------------------------------------------------------------------------

local function log(level, msg)
  local fn = slurm and (slurm[level] or slurm.log_info)
  if type(fn) == "function" then pcall(fn, "%s", msg) end
end

local function tell_user(msg)
  if slurm and type(slurm.log_user) == "function" then pcall(slurm.log_user, "%s", msg) end
end

local function het_offset(job_desc)
  local off = job_desc.het_job_offset
  if type(off) == "number" and off >= 0 and off < NO_VAL then return off end
  return nil
end

-- Specs of the het leader's script, kept for the other components of the same submission. slurmctld
-- submits the components of one het job one after another under its job write lock, starting at offset 0,
-- which resets this; user_id guards against using it for anyone else's job.
M._pending = nil

local function submit(job_desc)
  local offset = het_offset(job_desc)
  if offset == nil or offset == 0 then M._pending = nil end
  local script = job_desc.script
  if type(script) ~= "string" or script == "" then
    if offset ~= nil and offset > 0 then
      local pending = M._pending
      if pending and pending.user_id == job_desc.user_id and pending.specs[offset] then
        job_desc.admin_comment = M.embed(job_desc.admin_comment, pending.specs[offset])
      end
    end
    return slurm.SUCCESS
  end

  local result = M.parse_script(script)
  local spec, select_errors = M.select_component(result, offset)
  local errors = result.errors
  if #errors == 0 then errors = select_errors end
  if #errors > 0 then
    tell_user("slurm-elastic: job rejected: invalid #ELASTIC directives (slurm-elastic check SCRIPT shows the same):")
    for _, e in ipairs(errors) do
      tell_user("slurm-elastic: line " .. num(e.line) .. ": " .. M.describe(e))
    end
    log("log_info", format("slurm-elastic: rejected a job of uid %s: %d #ELASTIC error(s), first: line %s: %s",
      tostring(job_desc.user_id), #errors, num(errors[1].line), M.describe(errors[1])))
    return slurm.ERROR
  end
  for _, w in ipairs(result.warnings) do
    tell_user("slurm-elastic: warning: line " .. num(w.line) .. ": " .. w.message)
  end
  if spec then
    job_desc.admin_comment = M.embed_partitions(M.embed(job_desc.admin_comment, spec.normalized),
      job_desc.partition)
  end
  if offset == 0 then
    local by_group = {}
    for _, s in ipairs(result.specs) do
      if s.het ~= nil then by_group[s.het] = s.normalized end
    end
    M._pending = { user_id = job_desc.user_id, specs = by_group }
  end
  return slurm.SUCCESS
end

local function modify(job_desc, job_rec)
  local new = job_desc.admin_comment
  if type(new) ~= "string" then return end
  local old = job_rec and job_rec.admin_comment
  if type(old) ~= "string" then return end
  if not find(new, SEGMENT) then
    local body = M.extract(old)
    if body then new = M.embed(new, body) end
  end
  local parts = string.match(old, "%[elastic%-partitions:([^%[%]%s]*)%]")
  if parts and not find(new, PARTITIONS_SEGMENT) then new = M.embed_partitions(new, parts) end
  if new ~= job_desc.admin_comment then job_desc.admin_comment = new end
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local ok, rc = pcall(submit, job_desc)
  if ok then return rc end
  M._pending = nil
  log("log_error", "slurm-elastic: internal error, job accepted without checking #ELASTIC: " .. tostring(rc))
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  local ok, err = pcall(modify, job_desc, job_rec)
  if not ok then log("log_error", "slurm-elastic: internal error in job_modify: " .. tostring(err)) end
  return slurm.SUCCESS
end

-- Tests load this file with a stub `slurm` table and use the parser through this global.
slurm_elastic = M

return slurm.SUCCESS
