--[[
job_submit.lua for the DataWarp emulator: default burst buffer pool.

Slurm 22.05's burst_buffer/lua rejects "#DW ... capacity=10GB" without
"pool=" ("Must specify pool with capacity for burst buffer") and ignores
DefaultPool= in burst_buffer.conf. Real DataWarp sites accepted plain
"#DW jobdw capacity=10GB access_mode=striped type=scratch", so this
job_submit plugin appends " pool=<default>" to every #DW directive of the
leading comment block that has capacity= but no pool=, both in the batch
script and in --bb.

The default pool is the first "pool = NAME SIZE [GRANULARITY]" line of
burst_buffer_emulator.conf (next to this script or next to SLURM_CONF),
else "wlm_pool". Merge slurm_job_submit's body into your own job_submit.lua
if the site already has one.
--]]

local function dirname(p)
	return p:match("^(.*)/[^/]*$") or "."
end

local function default_pool()
	local candidates = {}
	local info = debug and debug.getinfo and debug.getinfo(1, "S")
	if info and info.source and info.source:sub(1, 1) == "@" then
		candidates[#candidates + 1] = dirname(info.source:sub(2)) ..
			"/burst_buffer_emulator.conf"
	end
	local sc = os.getenv("SLURM_CONF")
	if sc and sc ~= "" then
		candidates[#candidates + 1] = dirname(sc) .. "/burst_buffer_emulator.conf"
	end
	for _, c in ipairs(candidates) do
		local f = io.open(c, "r")
		if f then
			for line in f:lines() do
				local name = line:gsub("#.*$", ""):match("^%s*pool%s*=%s*(%S+)")
				if name then
					f:close()
					return name
				end
			end
			f:close()
		end
	end
	return "wlm_pool"
end

-- Append " pool=<pool>" to #DW directives with capacity= and no pool=.
-- Returns the new text and whether it changed.
local function add_default_pool(text, pool, whole_text_is_directives)
	local out = {}
	local changed = false
	local in_block = true
	local logical = {}  -- indexes into out of the current continued directive
	local function flush()
		local has_cap, has_pool = false, false
		for _, i in ipairs(logical) do
			if out[i]:find("capacity=", 1, true) then
				has_cap = true
			end
			if out[i]:find("pool=", 1, true) then
				has_pool = true
			end
		end
		if has_cap and not has_pool then
			local last = logical[#logical]
			out[last] = out[last]:gsub("%s*$", "") .. " pool=" .. pool
			changed = true
		end
		logical = {}
	end
	local trailing_newline = text:sub(-1) == "\n"
	local body = trailing_newline and text or (text .. "\n")
	for line in body:gmatch("([^\n]*)\n") do
		out[#out + 1] = line
		if in_block then
			if #logical > 0 then
				logical[#logical + 1] = #out
				if not line:match("\\%s*$") then
					flush()
				end
			elseif line:sub(1, 3) == "#DW" then
				logical[#logical + 1] = #out
				if not line:match("\\%s*$") then
					flush()
				end
			elseif not whole_text_is_directives and
				not line:match("^%s*$") and line:sub(1, 1) ~= "#" then
				in_block = false
			end
		end
	end
	if #logical > 0 then
		flush()
	end
	local result = table.concat(out, "\n")
	if trailing_newline then
		result = result .. "\n"
	end
	return result, changed
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	local pool = nil
	local script = job_desc.script
	if script ~= nil and script:find("#DW", 1, true) then
		pool = pool or default_pool()
		local new, changed = add_default_pool(script, pool, false)
		if changed then
			job_desc.script = new
			slurm.log_info("job_submit/lua: added pool=%s to #DW directives",
				pool)
		end
	end
	local bb = job_desc.burst_buffer
	if bb ~= nil and bb:find("#DW", 1, true) then
		pool = pool or default_pool()
		local new, changed = add_default_pool(bb, pool, true)
		if changed then
			job_desc.burst_buffer = new
		end
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end
