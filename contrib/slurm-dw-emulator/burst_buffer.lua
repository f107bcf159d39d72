--[[
burst_buffer.lua: a Cray DataWarp emulator for Slurm 22.05's burst_buffer/lua.

It makes a plain directory on the slurmctld host behave like a DataWarp
burst buffer for jobs that use DataWarp syntax:

  #DW jobdw capacity=10GB access_mode=striped type=scratch
  #DW stage_in  source=/pfs/in  destination=$DW_JOB_STRIPED/in  type=directory
  #DW stage_out source=$DW_JOB_STRIPED/out destination=/pfs/out type=directory
  #DW persistentdw name=mybb
  #BB create_persistent name=mybb capacity=100GB access_mode=striped type=scratch
  #BB destroy_persistent name=mybb

Needs in burst_buffer.conf: Directive=DW (and, recommended, Flags=TeardownFailure).
Configuration (base directory, pools, event log) is read from
burst_buffer_emulator.conf next to this script; see README.md.

Written for the Slurm 22.05 Lua API (hook signatures without uid/gid/job_info;
Lua 5.1). slurm_bb_job_process, slurm_bb_pools and slurm_bb_paths run inside
slurmctld with locks held: they only do pure-Lua work and small file appends.
The other hooks run in slurmscriptd children and may spawn commands.
--]]

local SUCCESS = (slurm and slurm.SUCCESS) or 0
local ERROR = (slurm and slurm.ERROR) or -1

---------------------------------------------------------------------------
-- small helpers
---------------------------------------------------------------------------

local function log_info(fmt, ...)
	if slurm and slurm.log_info then
		slurm.log_info("dw-emulator: " .. fmt, ...)
	end
end

local function log_error(fmt, ...)
	if slurm and slurm.log_error then
		slurm.log_error("dw-emulator: " .. fmt, ...)
	end
end

local function trim(s)
	return (s:gsub("^%s+", ""):gsub("%s+$", ""))
end

local function read_file(path)
	local f = io.open(path, "r")
	if not f then
		return nil
	end
	local data = f:read("*a")
	f:close()
	return data
end

local function shq(s)
	return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function dirname(p)
	local d = p:match("^(.*)/[^/]*$")
	if d == nil then
		return "."
	end
	if d == "" then
		return "/"
	end
	return d
end

local function join(a, b)
	if b == nil or b == "" then
		return a
	end
	if a:sub(-1) == "/" then
		a = a:sub(1, -2)
	end
	if b:sub(1, 1) == "/" then
		b = b:sub(2)
	end
	return a .. "/" .. b
end

-- Run a shell command; returns ok, output (stdout+stderr), exit code.
local function run(cmd)
	local p = io.popen("exec 2>&1; " .. cmd .. "\necho \"__emulator_rc=$?\"")
	if not p then
		return false, "cannot run command", 255
	end
	local out = p:read("*a") or ""
	p:close()
	local rc = tonumber(out:match("__emulator_rc=(%d+)%s*$")) or 255
	out = out:gsub("__emulator_rc=%d+%s*$", "")
	return rc == 0, trim(out), rc
end

---------------------------------------------------------------------------
-- sizes
---------------------------------------------------------------------------

-- Same suffixes as Slurm's suffix_mult() for burst buffer capacities:
-- K/KiB.. are powers of 1024, KB.. powers of 1000, N/node/nodes a node count.
local SIZE_MULT = {
	[""] = 1, b = 1,
	k = 1024, kib = 1024, m = 1024 ^ 2, mib = 1024 ^ 2,
	g = 1024 ^ 3, gib = 1024 ^ 3, t = 1024 ^ 4, tib = 1024 ^ 4,
	p = 1024 ^ 5, pib = 1024 ^ 5,
	kb = 1000, mb = 1000 ^ 2, gb = 1000 ^ 3, tb = 1000 ^ 4, pb = 1000 ^ 5,
}
local NODE_SUFFIX = { n = true, node = true, nodes = true }
-- A smaller unit to suggest when someone writes a decimal capacity.
local SMALLER_UNIT = {
	kb = { "", 1000 }, mb = { "KB", 1000 }, gb = { "MB", 1000 },
	tb = { "GB", 1000 }, pb = { "TB", 1000 },
	k = { "", 1024 }, m = { "KiB", 1024 }, g = { "MiB", 1024 },
	t = { "GiB", 1024 }, p = { "TiB", 1024 },
	kib = { "", 1024 }, mib = { "KiB", 1024 }, gib = { "MiB", 1024 },
	tib = { "GiB", 1024 }, pib = { "TiB", 1024 },
}

-- Parse a size; returns bytes (or node count), kind ("bytes"|"nodes") or
-- nil, error message.
local function parse_size(value, what)
	if value == nil or value == "" then
		return nil, what .. " is empty"
	end
	local num, suffix = value:match("^(%d+)(%a*)$")
	if num then
		local s = suffix:lower()
		if NODE_SUFFIX[s] then
			return tonumber(num), "nodes"
		end
		local mult = SIZE_MULT[s]
		if mult == nil then
			return nil, string.format(
				"%s=%s has an unknown unit '%s' (use K/KiB, M/MiB, G/GiB, " ..
				"T/TiB, P/PiB (powers of 1024) or KB, MB, GB, TB, PB " ..
				"(powers of 1000))", what, value, suffix)
		end
		return tonumber(num) * mult, "bytes"
	end
	local inum, frac, dsuffix = value:match("^(%d*)%.(%d+)(%a*)$")
	if inum then
		local msg = string.format(
			"%s=%s is not an integer: Slurm reads only the integer part " ..
			"of a burst buffer size (%s would become %s bytes); " ..
			"use an integer with a smaller unit", what, value, value,
			(inum ~= "" and inum or "0"))
		local smaller = SMALLER_UNIT[dsuffix:lower()]
		if smaller then
			local v = tonumber((inum ~= "" and inum or "0") .. "." .. frac) *
				smaller[2]
			if v == math.floor(v) then
				msg = msg .. string.format(", e.g. %s=%d%s", what, v,
					smaller[1])
			end
		end
		return nil, msg
	end
	return nil, string.format("%s=%s is not a valid size (expected an " ..
		"integer followed by a unit, e.g. %s=10GB)", what, value, what)
end

local function fmt_bytes(n)
	local units = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" }
	local i = 1
	while n >= 1024 and i < #units and n % 1024 == 0 do
		n = n / 1024
		i = i + 1
	end
	return string.format("%d%s", n, units[i])
end

---------------------------------------------------------------------------
-- configuration
---------------------------------------------------------------------------

local function script_dir()
	local info = debug and debug.getinfo and debug.getinfo(1, "S")
	if info and info.source and info.source:sub(1, 1) == "@" then
		return dirname(info.source:sub(2))
	end
	return nil
end

local function find_config()
	local candidates = {}
	local env_conf = os.getenv("SLURM_DW_EMULATOR_CONF")
	if env_conf and env_conf ~= "" then
		candidates[#candidates + 1] = env_conf
	end
	local sd = script_dir()
	if sd then
		candidates[#candidates + 1] = sd .. "/burst_buffer_emulator.conf"
	end
	local sc = os.getenv("SLURM_CONF")
	if sc and sc ~= "" then
		candidates[#candidates + 1] = dirname(sc) ..
			"/burst_buffer_emulator.conf"
	end
	candidates[#candidates + 1] = "/etc/slurm/burst_buffer_emulator.conf"
	for _, c in ipairs(candidates) do
		local f = io.open(c, "r")
		if f then
			f:close()
			return c
		end
	end
	return nil
end

local function load_config()
	local conf = {
		base_dir = "/var/spool/slurm-dw-emulator",
		log = nil,
		pools = {},
		state_save_location = nil,
		setpriv = "/usr/bin/setpriv",
		path = nil,
		errors = {},
	}
	local path = find_config()
	conf.path = path
	local text = path and read_file(path) or ""
	local lineno = 0
	for line in (text .. "\n"):gmatch("([^\n]*)\n") do
		lineno = lineno + 1
		line = trim(line:gsub("#.*$", ""))
		if line ~= "" then
			local key, value = line:match("^([%w_]+)%s*=%s*(.-)$")
			if not key then
				conf.errors[#conf.errors + 1] = string.format(
					"%s:%d: cannot parse '%s'", path, lineno, line)
			elseif key == "pool" then
				local name, size, gran = value:match("^(%S+)%s+(%S+)%s*(%S*)$")
				local bytes = size and parse_size(size, "pool size")
				local g = 1024 ^ 3
				if gran and gran ~= "" then
					g = parse_size(gran, "granularity")
				end
				if not name or not bytes or not g or g <= 0 then
					conf.errors[#conf.errors + 1] = string.format(
						"%s:%d: bad pool line '%s' (expected " ..
						"'pool = NAME SIZE [GRANULARITY]')", path, lineno, line)
				else
					conf.pools[#conf.pools + 1] = {
						name = name, bytes = bytes, granularity = g,
					}
				end
			elseif key == "base_dir" or key == "log" or
				key == "state_save_location" or key == "setpriv" then
				conf[key] = value
			else
				conf.errors[#conf.errors + 1] = string.format(
					"%s:%d: unknown key '%s'", path, lineno, key)
			end
		end
	end
	if #conf.pools == 0 then
		conf.pools[1] = { name = "wlm_pool", bytes = 100 * 1024 ^ 3,
			granularity = 1024 ^ 3 }
	end
	if conf.log == nil or conf.log == "" then
		conf.log = conf.base_dir .. "/events.log"
	end
	for _, e in ipairs(conf.errors) do
		log_error("%s", e)
	end
	return conf
end

local CONF = load_config()

local function job_dir(job_id)
	return CONF.base_dir .. "/job/" .. job_id
end

local function persistent_dir(name)
	return CONF.base_dir .. "/persistent/" .. name
end

local function meta_path(job_id)
	return CONF.base_dir .. "/meta/job." .. job_id
end

local function event(job_id, fn, ok, msg)
	msg = tostring(msg or ""):gsub("\n", " | ")
	local f = io.open(CONF.log, "a")
	if f then
		f:write(string.format("%d %s %s %s %s\n", os.time(),
			tostring(job_id or "-"), fn, ok and "OK" or "FAIL", msg))
		f:close()
	end
	if ok then
		log_info("JobId=%s %s OK %s", tostring(job_id or "-"), fn, msg)
	else
		log_error("JobId=%s %s FAIL %s", tostring(job_id or "-"), fn, msg)
	end
end

local function finish(job_id, fn, ok, msg)
	event(job_id, fn, ok, msg)
	if ok then
		return SUCCESS
	end
	return ERROR, fn .. ": " .. tostring(msg)
end

---------------------------------------------------------------------------
-- directive parsing and validation
---------------------------------------------------------------------------

-- Return the directives of the leading comment block, the way Slurm reads
-- them: scanning stops at the first line that does not start with '#',
-- empty lines are skipped, a trailing '\' continues on the next line.
-- Each entry: { prefix = "DW"|"BB", text = "...", line = N }.
local function extract_directives(script)
	local out = {}
	local pending = nil
	local lineno = 0
	for raw in (script .. "\n"):gmatch("([^\n]*)\n") do
		lineno = lineno + 1
		local line = raw:gsub("\r$", "")
		if line:match("^%s*$") then
			-- skipped, like Slurm does
		elseif line:sub(1, 1) ~= "#" then
			break
		else
			local prefix = nil
			if line:sub(1, 3) == "#DW" then
				prefix = "DW"
			elseif line:sub(1, 3) == "#BB" then
				prefix = "BB"
			end
			if pending then
				local body = prefix and line:sub(4) or line:sub(2)
				pending.text = pending.text .. " " .. body
				if prefix and prefix ~= pending.prefix then
					pending.mixed = true
				end
			elseif prefix then
				pending = { prefix = prefix, text = line:sub(4), line = lineno }
			end
			if pending then
				local t = pending.text
				if t:match("\\%s*$") then
					pending.text = t:gsub("\\%s*$", "")
				else
					out[#out + 1] = pending
					pending = nil
				end
			end
		end
	end
	if pending then
		out[#out + 1] = pending
	end
	return out
end

local function split_words(text)
	local words = {}
	for w in text:gmatch("%S+") do
		words[#words + 1] = w
	end
	return words
end

local VALID_NAME = "^[%a_][%w_]*$"

-- Parse "key=value" options; returns table or nil, error.
local function parse_options(words, first, allowed, directive)
	local opts = {}
	for i = first, #words do
		local w = words[i]
		local k, v = w:match("^([%w_]+)=(.*)$")
		if not k then
			if allowed["@flags"] and allowed["@flags"][w] then
				opts[w] = true
			else
				return nil, string.format("unexpected word '%s' in '%s' " ..
					"(options are key=value)", w, directive)
			end
		elseif not allowed[k] then
			return nil, string.format("unknown option '%s=' in '%s'", k,
				directive)
		elseif opts[k] ~= nil then
			return nil, string.format("option '%s=' given twice in '%s'", k,
				directive)
		else
			opts[k] = v
		end
	end
	return opts
end

local STAGE_TYPES = { file = true, directory = true, list = true }

-- Split a burst-buffer-side path into (kind, name, rest) or nil.
local function bb_path_parts(p)
	local rest = p:match("^%$DW_JOB_STRIPED(.*)$") or
		p:match("^%${DW_JOB_STRIPED}(.*)$")
	if rest then
		if rest ~= "" and rest:sub(1, 1) ~= "/" then
			return nil
		end
		return "job", nil, rest
	end
	local name
	name, rest = p:match("^%${DW_PERSISTENT_STRIPED_([%w_]+)}(.*)$")
	if not name then
		name, rest = p:match("^%$DW_PERSISTENT_STRIPED_([%w_]+)(.*)$")
	end
	if name then
		if rest ~= "" and rest:sub(1, 1) ~= "/" then
			return nil
		end
		return "persistent", name, rest
	end
	return nil
end

local function check_bb_side(p, what, spec, directive)
	local kind, name = bb_path_parts(p)
	if not kind then
		return string.format("%s=%s in '%s' must be inside the burst buffer: " ..
			"start it with $DW_JOB_STRIPED or $DW_PERSISTENT_STRIPED_<name>",
			what, p, directive)
	end
	if kind == "job" and not (spec.jobdw and spec.jobdw.striped) then
		return string.format("'%s' uses $DW_JOB_STRIPED but the job has no " ..
			"'#DW jobdw ... access_mode=striped'", directive)
	end
	if kind == "persistent" and not spec.persistent_set[name] then
		return string.format("'%s' uses $DW_PERSISTENT_STRIPED_%s but the job " ..
			"has no '#DW persistentdw name=%s'", directive, name, name)
	end
	return nil
end

local function check_pfs_side(p, what, directive)
	if p:sub(1, 1) ~= "/" then
		return string.format("%s=%s in '%s' must be an absolute path " ..
			"(DataWarp does not expand variables or relative paths)",
			what, p, directive)
	end
	if p:find("%$") then
		return string.format("%s=%s in '%s': shell variables are not expanded " ..
			"in #DW lines; write the full path", what, p, directive)
	end
	return nil
end

-- Parse and validate a job script. Returns spec or nil, error.
local function parse_script(script)
	local spec = {
		jobdw = nil, persistent = {}, persistent_set = {},
		stage_in = {}, stage_out = {}, creates = {}, destroys = {},
		swap = nil, dw_count = 0,
	}
	local stages = {}
	for _, d in ipairs(extract_directives(script)) do
		local directive = "#" .. d.prefix .. d.text
		directive = trim(directive:gsub("%s+", " "))
		if d.mixed then
			return nil, string.format("line %d: #DW and #BB mixed in one " ..
				"continued directive", d.line)
		end
		if d.prefix == "DW" and d.text:sub(1, 1) ~= "" and
			not d.text:sub(1, 1):match("%s") then
			return nil, string.format("unrecognized directive '%s'", directive)
		end
		local words = split_words(d.text)
		local verb = words[1]
		if d.prefix == "DW" then
			spec.dw_count = spec.dw_count + 1
		end
		if verb == nil then
			return nil, string.format("line %d: empty '#%s' directive", d.line,
				d.prefix)
		elseif d.prefix == "DW" and verb == "jobdw" then
			if spec.jobdw then
				return nil, "only one '#DW jobdw' is allowed per job"
			end
			local o, err = parse_options(words, 2, {
				capacity = true, access_mode = true, type = true, pool = true,
				pfs = true,
			}, directive)
			if not o then
				return nil, err
			end
			if not o.capacity then
				return nil, string.format("'%s' needs capacity=<size>, " ..
					"e.g. capacity=10GB", directive)
			end
			local bytes, kind_or_err = parse_size(o.capacity, "capacity")
			if not bytes then
				return nil, kind_or_err
			end
			if bytes <= 0 then
				return nil, "capacity must be greater than 0"
			end
			if not o.type then
				return nil, string.format("'%s' needs type=scratch or type=cache",
					directive)
			end
			if o.type ~= "scratch" and o.type ~= "cache" then
				return nil, string.format("type=%s in '%s' is invalid (use " ..
					"scratch or cache)", o.type, directive)
			end
			if o.type == "cache" and not o.pfs then
				return nil, string.format("'%s': type=cache needs pfs=<path>",
					directive)
			end
			if not o.access_mode then
				return nil, string.format("'%s' needs access_mode=striped, " ..
					"private or striped,private", directive)
			end
			local modes = {}
			for m in (o.access_mode .. ","):gmatch("([^,]*),") do
				if m ~= "striped" and m ~= "private" and m ~= "ldbalance" then
					return nil, string.format("access_mode=%s in '%s' is " ..
						"invalid (use striped, private or striped,private)",
						o.access_mode, directive)
				end
				modes[m] = true
			end
			spec.jobdw = {
				capacity = o.capacity, bytes = bytes, type = o.type,
				access_mode = o.access_mode, pool = o.pool,
				striped = modes.striped or false, private = modes.private or false,
			}
		elseif d.prefix == "DW" and verb == "persistentdw" then
			local o, err = parse_options(words, 2, { name = true }, directive)
			if not o then
				return nil, err
			end
			if not o.name or not o.name:match(VALID_NAME) then
				return nil, string.format("'%s' needs name=<name> (letters, " ..
					"digits and _, not starting with a digit)", directive)
			end
			if not spec.persistent_set[o.name] then
				spec.persistent[#spec.persistent + 1] = o.name
				spec.persistent_set[o.name] = true
			end
		elseif d.prefix == "DW" and (verb == "stage_in" or verb == "stage_out") then
			local o, err = parse_options(words, 2, {
				source = true, destination = true, type = true,
			}, directive)
			if not o then
				return nil, err
			end
			for _, k in ipairs({ "source", "destination", "type" }) do
				if not o[k] or o[k] == "" then
					return nil, string.format("'%s' needs %s=", directive, k)
				end
			end
			if not STAGE_TYPES[o.type] then
				return nil, string.format("type=%s in '%s' is invalid (use " ..
					"file, directory or list)", o.type, directive)
			end
			stages[#stages + 1] = { verb = verb, opts = o, directive = directive }
		elseif d.prefix == "DW" and verb == "swap" then
			spec.swap = words[2]
		elseif d.prefix == "BB" and verb == "create_persistent" then
			local o, err = parse_options(words, 2, {
				name = true, capacity = true, access_mode = true, access = true,
				type = true, pool = true,
			}, directive)
			if not o then
				return nil, err
			end
			if not o.name or not o.name:match(VALID_NAME) then
				return nil, string.format("'%s' needs name=<name> (letters, " ..
					"digits and _, not starting with a digit)", directive)
			end
			if not o.capacity then
				return nil, string.format("'%s' needs capacity=<size>", directive)
			end
			local bytes, err2 = parse_size(o.capacity, "capacity")
			if not bytes then
				return nil, err2
			end
			spec.creates[#spec.creates + 1] = { name = o.name, bytes = bytes,
				capacity = o.capacity }
		elseif d.prefix == "BB" and verb == "destroy_persistent" then
			local o, err = parse_options(words, 2, { name = true,
				["@flags"] = { hurry = true } }, directive)
			if not o then
				return nil, err
			end
			if not o.name or not o.name:match(VALID_NAME) then
				return nil, string.format("'%s' needs name=<name>", directive)
			end
			spec.destroys[#spec.destroys + 1] = { name = o.name }
		else
			return nil, string.format("unrecognized directive '%s'", directive)
		end
	end
	-- stage lines are checked once all jobdw/persistentdw lines are known
	for _, s in ipairs(stages) do
		if not spec.jobdw and #spec.persistent == 0 then
			return nil, string.format("'%s' needs a '#DW jobdw' or " ..
				"'#DW persistentdw' line in the same job", s.directive)
		end
		local o = s.opts
		local err
		if o.type == "list" then
			-- source = the list file (PFS path or burst buffer path);
			-- destination = base directory for relative list entries
			if not bb_path_parts(o.source) then
				err = check_pfs_side(o.source, "source", s.directive)
			end
			if not err then
				if s.verb == "stage_in" then
					err = check_bb_side(o.destination, "destination", spec,
						s.directive)
				else
					err = check_pfs_side(o.destination, "destination",
						s.directive)
				end
			end
		elseif s.verb == "stage_in" then
			err = check_pfs_side(o.source, "source", s.directive) or
				check_bb_side(o.destination, "destination", spec, s.directive)
		else
			err = check_bb_side(o.source, "source", spec, s.directive) or
				check_pfs_side(o.destination, "destination", s.directive)
		end
		if err then
			return nil, err
		end
		if s.verb == "stage_in" then
			spec.stage_in[#spec.stage_in + 1] = o
		else
			spec.stage_out[#spec.stage_out + 1] = o
		end
	end
	return spec
end

---------------------------------------------------------------------------
-- job state helpers
---------------------------------------------------------------------------

-- setup/data_in/post_run/data_out get a memfd copy that holds only the #DW
-- lines (with %j etc. substituted) when a #DW line contains '%'. #BB lines
-- are then only in the original script under StateSaveLocation.
local function original_script(job_id, job_script)
	if job_script and job_script:sub(1, 6) == "/proc/" and
		CONF.state_save_location then
		local id = tonumber(job_id)
		if id then
			local p = string.format("%s/hash.%d/job.%d/script",
				CONF.state_save_location, id % 10, id)
			local text = read_file(p)
			if text then
				return text
			end
		end
	end
	return read_file(job_script)
end

local function read_meta(job_id)
	local text = read_file(meta_path(job_id))
	if not text then
		return nil
	end
	local m = {}
	for k, v in text:gmatch("([%w_]+)=([^\n]*)") do
		m[k] = v
	end
	m.uid = tonumber(m.uid)
	m.gid = tonumber(m.gid)
	m.bb_size = tonumber(m.bb_size) or 0
	return m
end

local function write_meta(job_id, m)
	local f, err = io.open(meta_path(job_id), "w")
	if not f then
		return false, err
	end
	for _, k in ipairs({ "uid", "gid", "pool", "bb_size" }) do
		f:write(string.format("%s=%s\n", k, tostring(m[k])))
	end
	f:close()
	return true
end

local function resolve_bb(p, job_id)
	local kind, name, rest = bb_path_parts(p)
	if kind == "job" then
		return job_dir(job_id) .. "/striped" .. rest
	elseif kind == "persistent" then
		return persistent_dir(name) .. rest
	end
	return nil
end

-- Shell snippet (runs as the job user) that copies src to dst.
local function copy_snippet(src, dst, ctype)
	local s, d = shq(src), shq(dst)
	if ctype == "directory" then
		return string.format(
			"if [ ! -d %s ]; then echo \"source directory %s does not exist " ..
			"or is not a directory\"; exit 1; fi; mkdir -p %s && " ..
			"cp -Rp %s/. %s/ || exit 1", s, src, d, s, d)
	elseif ctype == "file" then
		if dst:sub(-1) == "/" then
			return string.format(
				"if [ ! -f %s ]; then echo \"source file %s does not exist " ..
				"or is not a regular file\"; exit 1; fi; mkdir -p %s && " ..
				"cp -p %s %s || exit 1", s, src, d, s, d)
		end
		return string.format(
			"if [ ! -f %s ]; then echo \"source file %s does not exist or " ..
			"is not a regular file\"; exit 1; fi; mkdir -p %s && " ..
			"cp -p %s %s || exit 1", s, src, shq(dirname(dst)), s, d)
	else -- auto: used for list entries
		return string.format(
			"if [ -d %s ]; then mkdir -p %s && cp -Rp %s/. %s/ || exit 1; " ..
			"elif [ -e %s ]; then mkdir -p %s && cp -p %s %s || exit 1; " ..
			"else echo \"source %s does not exist\"; exit 1; fi",
			s, d, s, d, s, shq(dirname(dst)), s, d, src)
	end
end

local function as_user(meta, cmd)
	return string.format("cd / && %s --reuid=%d --regid=%d --init-groups " ..
		"-- /bin/sh -c %s", CONF.setpriv, meta.uid, meta.gid, shq(cmd))
end

-- Resolve one side of a list entry.
local function resolve_list_side(p, base, bb_side, job_id)
	if bb_path_parts(p) then
		if not bb_side then
			return nil, string.format("list entry '%s' must be a file " ..
				"system path on this side", p)
		end
		return resolve_bb(p, job_id)
	end
	if p:sub(1, 1) == "/" then
		if bb_side then
			return nil, string.format("list entry '%s' must be inside the " ..
				"burst buffer ($DW_JOB_STRIPED/...) or relative to " ..
				"destination=", p)
		end
		return p
	end
	if base then
		return join(base, p)
	end
	return nil, string.format("list entry '%s' is a relative path", p)
end

-- Build the copy commands for stage_in or stage_out lines.
local function stage_commands(job_id, meta, stages, direction)
	local cmds = {}
	for _, o in ipairs(stages) do
		local src, dst
		if o.type == "list" then
			local list_path = bb_path_parts(o.source) and
				resolve_bb(o.source, job_id) or o.source
			local ok, text = run(as_user(meta, "cat " .. shq(list_path)))
			if not ok then
				return nil, string.format("cannot read list file %s: %s",
					o.source, text)
			end
			local base
			if direction == "in" then
				base = resolve_bb(o.destination, job_id)
			else
				base = o.destination
			end
			local n = 0
			for line in (text .. "\n"):gmatch("([^\n]*)\n") do
				line = trim(line)
				if line ~= "" and line:sub(1, 1) ~= "#" then
					local a, b = line:match("^(%S+)%s+(%S+)$")
					if not a then
						return nil, string.format("list file %s: bad line " ..
							"'%s' (expected 'source destination')", o.source,
							line)
					end
					local err
					src, err = resolve_list_side(a, nil, direction == "out",
						job_id)
					if not src then
						return nil, err
					end
					dst, err = resolve_list_side(b, base, direction == "in",
						job_id)
					if not dst then
						return nil, err
					end
					cmds[#cmds + 1] = copy_snippet(src, dst, "auto")
					n = n + 1
				end
			end
			if n == 0 then
				return nil, string.format("list file %s has no entries",
					o.source)
			end
		else
			if direction == "in" then
				src, dst = o.source, resolve_bb(o.destination, job_id)
			else
				src, dst = resolve_bb(o.source, job_id), o.destination
			end
			cmds[#cmds + 1] = copy_snippet(src, dst, o.type)
		end
	end
	return cmds
end

local function run_stage(job_id, job_script, direction)
	local fn = direction == "in" and "data_in" or "data_out"
	local text = read_file(job_script)
	if not text then
		return finish(job_id, fn, false, "cannot read job script " ..
			tostring(job_script))
	end
	local spec, perr = parse_script(text)
	if not spec then
		return finish(job_id, fn, false, perr)
	end
	local meta = read_meta(job_id)
	if not meta then
		return finish(job_id, fn, false, "no burst buffer metadata for job " ..
			"(setup did not run?)")
	end
	local stages = direction == "in" and spec.stage_in or spec.stage_out
	local cmds, err = stage_commands(job_id, meta, stages, direction)
	if not cmds then
		return finish(job_id, fn, false, err)
	end
	if #cmds > 0 then
		local ok, out = run(as_user(meta, table.concat(cmds, "\n")))
		if not ok then
			return finish(job_id, fn, false, out ~= "" and out or
				"copy failed")
		end
	end
	if direction == "in" and spec.jobdw and meta.bb_size > 0 then
		local ok, out = run("du -sb " .. shq(job_dir(job_id)) ..
			" | cut -f1")
		local used = tonumber(out)
		if ok and used and used > meta.bb_size then
			return finish(job_id, fn, false, string.format(
				"staged-in data (%d bytes) exceeds the burst buffer " ..
				"capacity (%d bytes)", used, meta.bb_size))
		end
	end
	return finish(job_id, fn, true, string.format("%d copy operation(s)",
		#cmds))
end

---------------------------------------------------------------------------
-- the burst_buffer/lua API (Slurm 22.05 signatures)
---------------------------------------------------------------------------

function slurm_bb_job_process(job_script)
	local text = read_file(job_script)
	if not text then
		return ERROR, "cannot read job script"
	end
	local spec, err = parse_script(text)
	if not spec then
		event(nil, "job_process", false, err)
		return ERROR, err
	end
	if spec.dw_count == 0 and #spec.creates == 0 and #spec.destroys == 0 then
		return SUCCESS
	end
	event(nil, "job_process", true, "")
	return SUCCESS
end

function slurm_bb_pools()
	local parts = {}
	for _, p in ipairs(CONF.pools) do
		parts[#parts + 1] = string.format(
			'{"id":"%s","granularity":%d,"quantity":%d}', p.name,
			p.granularity, math.floor(p.bytes / p.granularity))
	end
	return SUCCESS, '{"pools":[' .. table.concat(parts, ",") .. ']}'
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
	local text = original_script(job_id, job_script)
	if not text then
		return finish(job_id, "setup", false, "cannot read job script")
	end
	local spec, perr = parse_script(text)
	if not spec then
		return finish(job_id, "setup", false, perr)
	end
	local meta = { uid = tonumber(uid), gid = tonumber(gid), pool = pool,
		bb_size = tonumber(bb_size) or 0 }
	local base = CONF.base_dir
	local ok, out = run(string.format(
		"mkdir -p %s %s %s && chmod 755 %s %s %s", shq(base .. "/job"),
		shq(base .. "/persistent"), shq(base .. "/meta"), shq(base .. "/job"),
		shq(base .. "/persistent"), shq(base .. "/meta")))
	if not ok then
		return finish(job_id, "setup", false, out)
	end
	local wok, werr = write_meta(job_id, meta)
	if not wok then
		return finish(job_id, "setup", false, "cannot write metadata: " ..
			tostring(werr))
	end
	local dirs = { shq(job_dir(job_id)) }
	if spec.jobdw then
		if spec.jobdw.striped then
			dirs[#dirs + 1] = shq(job_dir(job_id) .. "/striped")
		end
		if spec.jobdw.private then
			dirs[#dirs + 1] = shq(job_dir(job_id) .. "/private")
		end
	end
	ok, out = run(string.format("install -d -o %d -g %d -m 0700 %s",
		meta.uid, meta.gid, table.concat(dirs, " ")))
	if not ok then
		return finish(job_id, "setup", false, out)
	end
	for _, c in ipairs(spec.creates) do
		local pdir = persistent_dir(c.name)
		local exists = run("test -e " .. shq(pdir))
		if exists then
			return finish(job_id, "setup", false, string.format(
				"persistent burst buffer '%s' already exists", c.name))
		end
		ok, out = run(string.format("install -d -o %d -g %d -m 0700 %s && " ..
			"printf 'owner=%d\\ncapacity=%s\\nbytes=%d\\ncreated=%d\\njob=%s\\n' > %s",
			meta.uid, meta.gid, shq(pdir), meta.uid, c.capacity, c.bytes,
			os.time(), job_id, shq(base .. "/meta/persistent." .. c.name)))
		if not ok then
			return finish(job_id, "setup", false, out)
		end
		event(job_id, "create_persistent", true, c.name .. " " .. c.capacity)
	end
	for _, name in ipairs(spec.persistent) do
		if not run("test -d " .. shq(persistent_dir(name))) then
			return finish(job_id, "setup", false, string.format(
				"persistent burst buffer '%s' does not exist", name))
		end
	end
	return finish(job_id, "setup", true, string.format("uid=%s pool=%s size=%s",
		tostring(uid), tostring(pool), tostring(bb_size)))
end

function slurm_bb_data_in(job_id, job_script)
	return run_stage(job_id, job_script, "in")
end

function slurm_bb_real_size(job_id)
	return SUCCESS
end

function slurm_bb_paths(job_id, job_script, path_file)
	local text = read_file(job_script)
	if not text then
		return finish(job_id, "paths", false, "cannot read job script")
	end
	local spec, perr = parse_script(text)
	if not spec then
		return finish(job_id, "paths", false, perr)
	end
	local f, ferr = io.open(path_file, "w")
	if not f then
		return finish(job_id, "paths", false, "cannot open path file: " ..
			tostring(ferr))
	end
	local names = {}
	if spec.jobdw and spec.jobdw.striped then
		f:write("DW_JOB_STRIPED=" .. job_dir(job_id) .. "/striped/\n")
		names[#names + 1] = "DW_JOB_STRIPED"
	end
	if spec.jobdw and spec.jobdw.private then
		f:write("DW_JOB_PRIVATE=" .. job_dir(job_id) .. "/private/\n")
		names[#names + 1] = "DW_JOB_PRIVATE"
	end
	for _, name in ipairs(spec.persistent) do
		f:write("DW_PERSISTENT_STRIPED_" .. name .. "=" ..
			persistent_dir(name) .. "/\n")
		names[#names + 1] = "DW_PERSISTENT_STRIPED_" .. name
	end
	f:close()
	return finish(job_id, "paths", true, table.concat(names, ","))
end

function slurm_bb_pre_run(job_id, job_script)
	return finish(job_id, "pre_run", true, "")
end

function slurm_bb_post_run(job_id, job_script)
	return finish(job_id, "post_run", true, "")
end

function slurm_bb_data_out(job_id, job_script)
	return run_stage(job_id, job_script, "out")
end

function slurm_bb_job_teardown(job_id, job_script, hurry)
	local ok, out = run(string.format("rm -rf %s %s", shq(job_dir(job_id)),
		shq(meta_path(job_id))))
	if not ok then
		return finish(job_id, "teardown", false, out)
	end
	local text = original_script(job_id, job_script)
	local spec = text and parse_script(text)
	if spec then
		for _, d in ipairs(spec.destroys) do
			ok, out = run(string.format("rm -rf %s %s",
				shq(persistent_dir(d.name)),
				shq(CONF.base_dir .. "/meta/persistent." .. d.name)))
			if not ok then
				return finish(job_id, "teardown", false, out)
			end
			event(job_id, "destroy_persistent", true, d.name)
		end
	end
	return finish(job_id, "teardown", true, "hurry=" .. tostring(hurry))
end

function slurm_bb_get_status(...)
	local lines = {}
	lines[#lines + 1] = "DataWarp emulator (burst_buffer.lua)"
	lines[#lines + 1] = "  config=" .. tostring(CONF.path) .. " base_dir=" ..
		CONF.base_dir .. " log=" .. CONF.log
	for _, p in ipairs(CONF.pools) do
		lines[#lines + 1] = string.format("  pool %s size=%s granularity=%s",
			p.name, fmt_bytes(p.bytes), fmt_bytes(p.granularity))
	end
	local _, out = run("cd " .. shq(CONF.base_dir) ..
		" 2>/dev/null && for d in job/* persistent/*; do [ -d \"$d\" ] && " ..
		"printf '%s %s %s\\n' \"$d\" \"$(stat -c %U \"$d\")\" " ..
		"\"$(du -sb \"$d\" | cut -f1)\"; done")
	lines[#lines + 1] = "Buffers (path owner used_bytes):"
	if out ~= "" then
		for l in (out .. "\n"):gmatch("([^\n]*)\n") do
			if l ~= "" then
				lines[#lines + 1] = "  " .. l
			end
		end
	else
		lines[#lines + 1] = "  (none)"
	end
	return SUCCESS, table.concat(lines, "\n") .. "\n"
end

-- Exposed for offline tests (lua5.1 test runner); harmless for Slurm.
dw_emulator = {
	parse_script = parse_script,
	parse_size = parse_size,
	extract_directives = extract_directives,
	config = CONF,
}
