-- Minimal JSON for the Lua test drivers (tests only; the plugin never uses JSON). Lua 5.1 .. 5.4.
-- decode: objects -> tables, arrays -> sequences, null -> json.null. \u escapes become UTF-8.
-- encode: json.array(t) / json.object(t) mark tables; unmarked tables are arrays when t[1] ~= nil or empty,
-- objects otherwise. Object keys are sorted, so equal values encode to equal text.
local json = {}

json.null = setmetatable({}, { __tostring = function() return "null" end })
local ARRAY, OBJECT = { kind = "array" }, { kind = "object" }

function json.array(t) return setmetatable(t or {}, ARRAY) end
function json.object(t) return setmetatable(t or {}, OBJECT) end

local function utf8_char(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then
    return string.char(0xC0 + math.floor(cp / 0x40), 0x80 + cp % 0x40)
  end
  if cp < 0x10000 then
    return string.char(0xE0 + math.floor(cp / 0x1000), 0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
  end
  return string.char(0xF0 + math.floor(cp / 0x40000), 0x80 + math.floor(cp / 0x1000) % 0x40,
    0x80 + math.floor(cp / 0x40) % 0x40, 0x80 + cp % 0x40)
end

local ESCAPES = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

function json.decode(text)
  local pos = 1
  local function fail(msg) error(string.format("json: %s at byte %d", msg, pos), 0) end
  local function skip() pos = string.find(text, "[^ \t\r\n]", pos) or (#text + 1) end
  local value
  local function str()
    pos = pos + 1
    local out = {}
    while true do
      local s, e = string.find(text, '^[^"\\]+', pos)
      if s then
        out[#out + 1] = string.sub(text, s, e)
        pos = e + 1
      end
      local c = string.sub(text, pos, pos)
      if c == '"' then
        pos = pos + 1
        return table.concat(out)
      elseif c == "\\" then
        local n = string.sub(text, pos + 1, pos + 1)
        if n == "u" then
          local cp = tonumber(string.sub(text, pos + 2, pos + 5), 16) or fail("bad \\u escape")
          pos = pos + 6
          if cp >= 0xD800 and cp < 0xDC00 and string.sub(text, pos, pos + 1) == "\\u" then
            local lo = tonumber(string.sub(text, pos + 2, pos + 5), 16)
            if lo and lo >= 0xDC00 and lo < 0xE000 then
              cp = 0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00)
              pos = pos + 6
            end
          end
          out[#out + 1] = utf8_char(cp)
        elseif ESCAPES[n] then
          out[#out + 1] = ESCAPES[n]
          pos = pos + 2
        else
          fail("bad escape")
        end
      else
        fail("unterminated string")
      end
    end
  end
  function value()
    skip()
    local c = string.sub(text, pos, pos)
    if c == "{" then
      local t = json.object()
      pos = pos + 1
      skip()
      if string.sub(text, pos, pos) == "}" then pos = pos + 1 return t end
      while true do
        skip()
        if string.sub(text, pos, pos) ~= '"' then fail("expected a key") end
        local k = str()
        skip()
        if string.sub(text, pos, pos) ~= ":" then fail("expected ':'") end
        pos = pos + 1
        t[k] = value()
        skip()
        local d = string.sub(text, pos, pos)
        pos = pos + 1
        if d == "}" then return t end
        if d ~= "," then fail("expected ',' or '}'") end
      end
    elseif c == "[" then
      local t = json.array()
      pos = pos + 1
      skip()
      if string.sub(text, pos, pos) == "]" then pos = pos + 1 return t end
      while true do
        t[#t + 1] = value()
        skip()
        local d = string.sub(text, pos, pos)
        pos = pos + 1
        if d == "]" then return t end
        if d ~= "," then fail("expected ',' or ']'") end
      end
    elseif c == '"' then
      return str()
    elseif string.sub(text, pos, pos + 3) == "true" then
      pos = pos + 4 return true
    elseif string.sub(text, pos, pos + 4) == "false" then
      pos = pos + 5 return false
    elseif string.sub(text, pos, pos + 3) == "null" then
      pos = pos + 4 return json.null
    else
      local s, e = string.find(text, "^-?[0-9]+%.?[0-9]*[eE]?[-+]?[0-9]*", pos)
      if not s then fail("unexpected character") end
      pos = e + 1
      return tonumber(string.sub(text, s, e))
    end
  end
  local v = value()
  skip()
  if pos <= #text then fail("trailing data") end
  return v
end

local function encode_string(s)
  return '"' .. string.gsub(s, '[%c"\\\128-\255]', function(c)
    if c == '"' then return '\\"' end
    if c == "\\" then return "\\\\" end
    return string.format("\\u%04x", string.byte(c))
  end) .. '"'
end

function json.encode(v)
  local t = type(v)
  if v == nil or v == json.null then return "null" end
  if t == "boolean" then return v and "true" or "false" end
  if t == "number" then
    if v == math.floor(v) and v > -1e15 and v < 1e15 then return string.format("%d", v) end
    return string.format("%.17g", v)
  end
  if t == "string" then return encode_string(v) end
  if t ~= "table" then error("json: can not encode a " .. t, 0) end
  local mt = getmetatable(v)
  if mt == ARRAY or (mt ~= OBJECT and (v[1] ~= nil or next(v) == nil)) then
    local out = {}
    for i = 1, #v do out[i] = json.encode(v[i]) end
    return "[" .. table.concat(out, ",") .. "]"
  end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do
    local item = v[k]
    if item == nil then item = v[tonumber(k)] end
    out[#out + 1] = encode_string(k) .. ":" .. json.encode(item)
  end
  return "{" .. table.concat(out, ",") .. "}"
end

return json
